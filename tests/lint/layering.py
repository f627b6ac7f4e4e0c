#!/usr/bin/env python3
"""The layering lint of kshard's headers and tools (issue 38, item 7).

    python3 tests/lint/layering.py --include <include_dir> [--tools <tools_dir>] [--functions]

Prints one line per violation, `path:line: rule: message`, and a summary, and exits 1; prints a
one-line summary and exits 0 when there is none (2: bad arguments). Standard library only. The
tables come first; RULES below them names what each rule checks.
"""

# The layers, lowest first. A header may include kshard headers of its own layer or lower.
LAYERS = (
    ("floor", ("error.hpp", "detail/*.hpp")),
    ("values", ("index.hpp", "bfloat16.hpp", "float16.hpp", "axis_split.hpp", "placement.hpp",
                "layout_mapping.hpp", "layout_dispatch.hpp", "log.hpp", "comm/reduce_op.hpp")),
    ("kernels", ("kernels/**",)),
    ("comm", ("comm/**", "watchdog.hpp")),
    ("matrix", ("mesh.hpp", "dist_matrix.hpp", "distribute.hpp", "format.hpp",
                "matrix_agreement.hpp")),
    ("algorithms", ("redistribute.hpp", "redistribute/**", "rowwise.hpp", "repair.hpp",
                    "repair/**", "tensor_parallel.hpp", "tensor_parallel/**")),
    # io's floors: its vocabulary; the engine that moves bytes, whatever the format; the file
    # encodings formats share (torch.save archives and pickles, safetensors files); one folder
    # per checkpoint format; the faces (io/*.hpp, io.hpp) with their internals' folders.
    ("io model", ("io/model/**",)),
    ("io engine", ("io/engine/**",)),
    ("io encodings", ("io/torch/**", "io/safetensors/**")),
    ("io formats", ("io/formats/**",)),
    ("io", ("io/**", "io.hpp")),
    ("umbrella", ("kshard.hpp",)),
)
# A wing's internals (folder) -> its faces: from the same layer only these, or files in the
# folder itself, may include them. comm/ is a layer, not a wing.
WINGS = {
    "redistribute/": ("redistribute.hpp",),
    "repair/": ("repair.hpp",),
    "tensor_parallel/": ("tensor_parallel.hpp",),
    "io/checkpoint/": ("io/*.hpp", "io/convert/**"),
    "io/convert/": ("io/*.hpp",),
}
# Each checkpoint format is a folder here, and no format includes another's.
FORMATS = "io/formats/"
FLOOR = "detail/**"                               # the floor's files that rule 2 binds
FLOOR_MAY_INCLUDE = ("error.hpp", "detail/**")
KERNELS = "kernels/**"
KERNELS_NEVER_INCLUDE = ("comm/**", "mesh.hpp", "dist_matrix.hpp")
COMM = "comm/**"                                  # moves bytes and agrees; knows no matrices
COMM_NEVER_INCLUDE = ("placement.hpp", "layout_mapping.hpp", "layout_dispatch.hpp",
                      "axis_split.hpp")
MPI_ALLOWED = ("comm/**", "mesh.hpp", "io/engine/mpi_file.hpp")
MPI_HEADERS = ("mpi.h", "mpi-ext.h")
MACRO_INCLUDES = {"comm/**": ("KSHARD_COMM_BACKEND_HEADER",)}
# In tools/: MPI_Init*, MPI_Finalize, MPI_COMM_WORLD, MPI_Abort and the like are fine, these not.
TOOLS_FORBIDDEN_MPI = (r"\bMPI_(?:I?(?:Bcast|Allreduce|Reduce\w*|Allgather\w*|Gather\w*"
                       r"|Scatter\w*|Alltoall\w*|Barrier|Exscan|Scan)|Neighbor_\w+"
                       r"|Comm_split\w*|File_\w+)\b")
TOOLS_FORBIDDEN_NAMESPACES = r"\b(?:kshard\s*::\s*(?:io\s*::\s*)?|io\s*::\s*)detail\b"
TOOLS_FORBIDDEN_INCLUDES = ("detail/**", "**/detail/**", "io/engine/**", "io/torch/**",
                            "io/safetensors/**", "io/formats/**") + tuple(w + "**" for w in WINGS)
MAX_FUNCTION_LINES = 60  # from the line of a function's name to its closing brace, inclusive
HEADER_SUFFIXES = (".hpp", ".h", ".hh", ".hxx", ".ipp", ".inl", ".tpp")
SOURCE_SUFFIXES = HEADER_SUFFIXES + (".cpp", ".cc", ".cxx")
# Patterns are relative to include/kshard/: `*` stays within one folder, `**` crosses folders.

RULES = """
  not-in-table          every header under include/kshard/ is placed in LAYERS.
  missing-include       an included kshard header exists.
  upward-include        a header includes kshard headers of its own layer or lower ones only.
  wing-internal         a wing's internals (WINGS) are included, from the wing's own layer, only
                        by its faces or by files of the wing itself; higher layers may include them.
  format-include        a format's folder (FORMATS<name>/) includes no other format's headers.
  floor-include         a file in detail/ includes only kshard/error.hpp and kshard/detail/.
  kernel-reaches-comm   kernels/ never includes comm/, mesh.hpp or dist_matrix.hpp.
  comm-knows-layouts    comm/ never includes placements or layouts (COMM_NEVER_INCLUDE).
  macro-include         `#include MACRO` only where MACRO_INCLUDES allows it.
  mpi-outside-comm      <mpi.h>, <mpi-ext.h> and MPI_ identifiers only in MPI_ALLOWED (in code:
                        comments and string literals do not count).
  tools-raw-collective  the tools call no MPI collective themselves (TOOLS_FORBIDDEN_MPI).
  tools-detail          the tools use public faces only: no detail namespace, no detail/ header,
                        no wing internals, no io floor but io/model/.
  function-length       no function (in include/kshard/ and tools/) is longer than
                        MAX_FUNCTION_LINES; count_convention says how lines are counted.
  braces                the braces could be matched (otherwise function lengths are unsure).
"""

# (The imports follow the tables, which a reader should see first.)

import argparse
import collections
import functools
import os
import re
import sys

Violation = collections.namedtuple("Violation", "path line rule message")
Include = collections.namedtuple("Include", "line kind path")  # kind: quote, angle or macro
Token = collections.namedtuple("Token", "text line")
Function = collections.namedtuple("Function", "name line end")


# --- Paths and the table --------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _pattern(glob):
    parts = re.split(r"(\*\*|\*)", glob)
    regex = "".join({"**": ".*", "*": "[^/]*"}.get(p, re.escape(p)) for p in parts)
    return re.compile(regex)


def matches(rel, globs):
    if isinstance(globs, str):
        globs = (globs,)
    return any(_pattern(g).fullmatch(rel) for g in globs)


def layer_of(rel):
    """The rank (0 = floor) and name of the layer holding `rel`, or None."""
    for rank, (name, globs) in enumerate(LAYERS):
        if matches(rel, globs):
            return rank, name
    return None


def format_of(rel):
    """The format folder (`dcp`) holding `rel`, or None."""
    return rel[len(FORMATS):].split("/")[0] if rel.startswith(FORMATS) and \
        "/" in rel[len(FORMATS):] else None


def wing_of(rel):
    return next((wing for wing in WINGS if rel.startswith(wing)), None)


def list_files(root, suffixes):
    found = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        found += [os.path.join(folder, f) for f in sorted(files) if f.endswith(suffixes)]
    return found


# --- Reading C++: comments and literals out, tokens, functions ------------------------------

def _blank(text):
    return re.sub(r"[^\n]", " ", text)


def _line_comment_end(text, i):
    """Index of the newline that ends the // comment at text[i] (a backslash at a line's end goes on)."""
    while True:
        end = text.find("\n", i)
        if end < 0:
            return len(text)
        if not text[i:end].rstrip("\r").endswith("\\"):
            return end
        i = end + 1


def _quoted_end(text, i, quote):
    """Index after the literal opened by text[i] == quote (or its line's end, if unclosed)."""
    j = i + 1
    while j < len(text) and text[j] not in (quote, "\n"):
        j += 2 if text[j] == "\\" else 1
    return min(j + 1, len(text)) if j < len(text) and text[j] == quote else j


def _word_before(text, i, chars=r"[\w.]"):
    j = i
    while j > 0 and re.match(chars, text[j - 1]):
        j -= 1
    return text[j:i]


def _literal_end(text, i):
    """Index after the string or char literal at text[i], or None when text[i] opens none."""
    c = text[i]
    if c == '"' and _word_before(text, i, r"\w") in ("R", "u8R", "uR", "UR", "LR"):
        open_paren = text.find("(", i)
        delimiter = text[i + 1:open_paren]
        close = text.find(")" + delimiter + '"', open_paren)
        return len(text) if open_paren < 0 or close < 0 else close + len(delimiter) + 2
    if c == '"':
        return _quoted_end(text, i, '"')
    word = _word_before(text, i)
    if word[:1].isdigit():  # a digit separator: 1'000'000
        return None
    return _quoted_end(text, i, "'")


def strip_code(text):
    """`text` with comments and the insides of string and char literals (raw ones too) blanked.

    Lines and columns are kept: newlines stay, literals keep their quotes."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            j = n if end < 0 else end + 2
            out.append(_blank(text[i:j]))
        elif text.startswith("//", i):
            j = _line_comment_end(text, i)
            out.append(_blank(text[i:j]))
        elif c in "\"'" and (j := _literal_end(text, i)) is not None:
            closed = j - i >= 2 and text[j - 1] == c
            out.append(c + _blank(text[i + 1:j - 1 if closed else j]) + (c if closed else ""))
        else:
            out.append(c)
            j = i + 1
        i = j
    return "".join(out)


def blank_directives(code):
    """Preprocessor lines (and their continuations) blanked, for reading braces."""
    lines, continued = code.split("\n"), False
    for k, line in enumerate(lines):
        if continued or line.lstrip().startswith("#"):
            continued = line.rstrip().endswith("\\")
            lines[k] = " " * len(line)
    return "\n".join(lines)


_TOKEN = re.compile(r"""(?P<space>\s+) | (?P<literal>"\s*"|'\s*') | (?P<word>[A-Za-z_]\w*)
    | (?P<number>\.?\d[\w.']*) | (?P<op>::|->|\.\.\.|&&|\|\||<=|>=|==|!=|<<|[-+*/%&|^]=|\+\+|--|.)
""", re.VERBOSE)


def tokenize(code):
    tokens, line = [], 1
    for m in _TOKEN.finditer(code):
        if m.lastgroup != "space":
            tokens.append(Token(m.group(), line))
        line += m.group().count("\n")
    return tokens


OPENING, CLOSING = ("(", "["), (")", "]")
CLASS_KEYS = {"class", "struct", "union", "enum"}
ACCESS = (["public"], ["private"], ["protected"])
NOT_NAMES = {"decltype", "alignas", "alignof", "sizeof", "noexcept", "throw", "requires",
             "explicit", "__attribute__", "__declspec", "static_assert", "typeid", "operator"}
MACRO = re.compile(r"[A-Z][A-Z0-9_]+")


def _depth(tokens):
    return sum((t.text in OPENING) - (t.text in CLOSING) for t in tokens)


def _strip_templates(head):
    """`head` without its leading `template <...>` prefixes (whose `class` opens no class)."""
    while len(head) > 1 and head[0].text == "template" and head[1].text == "<":
        angles = parens = 0
        for j in range(1, len(head)):
            parens += (head[j].text in OPENING) - (head[j].text in CLOSING)
            if parens == 0:  # a > within parentheses closes no template parameter list
                angles += (head[j].text == "<") - (head[j].text == ">")
            if angles == 0:
                break
        head = head[j + 1:]
    return head


def _top_level(head):
    """The tokens of `head` outside () and [] groups (the opening ( and [ kept)."""
    top, depth = [], 0
    for t in head:
        if depth == 0:
            top.append(t)
        depth += (t.text in OPENING) - (t.text in CLOSING)
    return top


def _name_before(top, n):
    """The name of a function whose parameter list opens at top[n], or None."""
    k = n - 1
    if top[k].text == ">":  # f<int>(...): back to the identifier before the template arguments
        depth = 0
        while k > 0 and (depth := depth + (top[k].text == ">") - (top[k].text == "<")) != 0:
            k -= 1
        k -= 1
    if k < 0 or not re.fullmatch(r"[A-Za-z_]\w*", top[k].text) or top[k].text in NOT_NAMES:
        return None
    name, line = top[k].text, top[k].line
    if k > 0 and top[k - 1].text == "~":
        name = "~" + name
    if k > 1 and top[k - 1].text == "::" and re.fullmatch(r"\w+", top[k - 2].text):
        name = top[k - 2].text + "::" + name
    return name, line


def _operator_name(top, n):
    """operator(), operator==, operator bool, ...: top[n] is `operator`."""
    words = [t.text for t in top[n + 1:]]
    if words[:2] == ["(", "("]:
        return "operator()", top[n].line
    spelled = "".join(words[:words.index("(")] if "(" in words else [])
    return "operator" + (" " if spelled[:1].isalpha() else "") + spelled, top[n].line


def _function_name(head):
    """(name, line) of the function a head declares: the first name before a top-level `(`,
    passing over ALL_CAPS macros (KOKKOS_INLINE_FUNCTION, ...) when a real name follows."""
    top, found = _top_level(head), []
    for n, t in enumerate(top):
        if t.text == "operator" and n + 1 < len(top):
            found.append(_operator_name(top, n))
        elif t.text == "(" and n > 0 and (name := _name_before(top, n)):
            found.append(name)
    real = [f for f in found if not MACRO.fullmatch(f[0])]
    return (real or found or [None])[0]


def _classify(head):
    """What a `{` after `head` opens at namespace or class scope: "scope" (namespace, class,
    enum, extern "C"), "brace" (braces within an expression or a member initializer), "other"
    (an initializer), or, for a function body, the function's (name, line)."""
    if _depth(head) > 0:
        return "brace"
    head = _strip_templates(head)
    words = [t.text for t in _top_level(head)]
    if "namespace" in words or CLASS_KEYS & set(words):
        return "scope"
    if words[:1] == ["extern"] and len(words) == 2 and words[1].startswith('"'):
        return "scope"
    if any(w == "=" and (k == 0 or words[k - 1] != "operator") for k, w in enumerate(words)):
        return "other"
    if ":" in words and head[-1].text not in (")", "{}", "..."):
        return "brace"  # X() : a_{1}, b_{2} {: the member initializers' braces come first
    return _function_name(head) or "other"


def _block_end(tokens, i):
    """Index after the `}` that closes the `{` at tokens[i]; None if none does."""
    depth = 0
    for j in range(i, len(tokens)):
        depth += (tokens[j].text == "{") - (tokens[j].text == "}")
        if depth == 0:
            return j + 1
    return None


def _parse_scope(tokens, i, functions, problems):
    """Reads a namespace or class scope from tokens[i] to its `}`, recording the functions
    defined in it. Returns the index after that `}`, or None at the end of the file."""
    head = []
    while i < len(tokens):
        t = tokens[i]
        if t.text == "}":
            return i + 1
        if t.text == ";" or (t.text == ":" and [h.text for h in head] in ACCESS):
            head, i = [], i + 1
        elif t.text != "{":
            head, i = head + [t], i + 1
        elif (kind := _classify(head)) == "scope":
            i, head = _parse_scope(tokens, i + 1, functions, problems), []
            if i is None:
                problems.append((t.line, "this { is never closed"))
                return None
        else:
            end = _block_end(tokens, i)
            if end is None:
                problems.append((t.line, "this { is never closed"))
                return None
            if isinstance(kind, tuple):
                functions.append(Function(kind[0], kind[1], tokens[end - 1].line))
                head = []
            else:
                head = head + [Token("{}", t.line)]
            i = end
    return None


def find_functions(code):
    """The functions defined in `code` (comments and literals stripped) and brace problems.

    A function body is a `{` at namespace or class scope after a head that has a parameter
    list, whatever follows it (const, noexcept, -> T, requires, member initializers)."""
    tokens = tokenize(blank_directives(code))
    functions, problems, i = [], [], 0
    while i is not None and i < len(tokens):
        i = _parse_scope(tokens, i, functions, problems)
        if i is not None:
            problems.append((tokens[i - 1].line, "this } closes no {"))
    return functions, problems


def count_convention(function):
    """A function's length: from the line of its name to its closing brace, inclusive (the
    template line and a return type on lines of their own not counted). Lambdas and local
    classes are counted in the function that holds them."""
    return function.end - function.line + 1


# --- The checks -----------------------------------------------------------------------------

Source = collections.namedtuple("Source", "path code includes")
_INCLUDE = re.compile(r'\s*#\s*include\s*(?:"([^"\n]*)"|<([^>\n]*)>|([A-Za-z_]\w*))')
_MPI_NAME = re.compile(r"\bMPI_\w*")


def read_source(path):
    """A file's path as printed, its code (comments and literals blanked) and its includes."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    code, includes = strip_code(text), []
    for n, (line, live) in enumerate(zip(text.split("\n"), code.split("\n")), 1):
        m = _INCLUDE.match(line) if re.match(r"\s*#\s*include\b", live) else None
        if m:
            kind = "quote" if m.group(1) is not None else "angle" if m.group(2) else "macro"
            includes.append(Include(n, kind, m.group(1) or m.group(2) or m.group(3)))
    return Source(os.path.normpath(path), code, includes)


def kshard_target(include, includer, kshard_dir):
    """What an include names, relative to include/kshard/ (None: not a kshard header).

    kshard/... in quotes or brackets, and a quoted path relative to a header in kshard/."""
    if include.kind == "macro":
        return None
    if include.path.startswith("kshard/"):
        return os.path.normpath(include.path[len("kshard/"):]).replace(os.sep, "/")
    if include.kind == "quote" and includer is not None:
        rel = os.path.normpath(os.path.join(os.path.dirname(includer), include.path))
        if not rel.startswith("..") and os.path.isfile(os.path.join(kshard_dir, rel)):
            return rel.replace(os.sep, "/")
    return None


def _exists(target, kshard_dir):
    return not target.startswith("..") and os.path.isfile(os.path.join(kshard_dir, target))


def edge_rule(src, dst):
    """(rule, message) when header `src` may not include header `dst` (both placed or not)."""
    if matches(src, FLOOR) and not matches(dst, FLOOR_MAY_INCLUDE):
        return "floor-include", f"{src} is in the floor and may include only " \
                                f"kshard/error.hpp and kshard/detail/, not kshard/{dst}"
    if matches(src, KERNELS) and matches(dst, KERNELS_NEVER_INCLUDE):
        return "kernel-reaches-comm", f"{src} is a kernel and may not include kshard/{dst}"
    if matches(src, COMM) and matches(dst, COMM_NEVER_INCLUDE):
        return "comm-knows-layouts", f"{src} is in comm/, which knows no matrices, and may " \
                                     f"not include kshard/{dst}"
    if format_of(src) and format_of(dst) and format_of(src) != format_of(dst):
        return "format-include", f"{src} is in the format {format_of(src)} and may not include " \
                                 f"kshard/{dst} of the format {format_of(dst)}"
    below, above = layer_of(src), layer_of(dst)
    if below is None or above is None:
        return None
    if above[0] > below[0]:
        return "upward-include", f"{src} (layer {below[1]}) includes kshard/{dst} " \
                                 f"of the higher layer {above[1]}"
    wing = wing_of(dst)
    if above[0] == below[0] and wing and not src.startswith(wing) \
            and not matches(src, WINGS[wing]):
        return "wing-internal", f"kshard/{dst} is internal to {wing}; in layer {below[1]} " \
                                f"only {', '.join(WINGS[wing])} and {wing} may include it"
    return None


def include_violations(source, rel, kshard_dir):
    """Rules of the header at `rel` (relative to include/kshard/) on its includes."""
    found = []
    for inc in source.includes:
        where = (source.path, inc.line)
        if inc.kind == "macro":
            allowed = [m for g, ms in MACRO_INCLUDES.items() if matches(rel, g) for m in ms]
            only = "; ".join(f"{' or '.join(ms)} in {g}" for g, ms in MACRO_INCLUDES.items())
            if inc.path not in allowed:
                found.append(Violation(*where, "macro-include", f"#include {inc.path}: a macro "
                                       f"include is allowed only as {only}"))
            continue
        target = kshard_target(inc, rel, kshard_dir)
        if target is None:
            continue
        if not _exists(target, kshard_dir):
            found.append(Violation(*where, "missing-include", f"kshard/{target} does not exist"))
        elif rule := edge_rule(rel, target):
            found.append(Violation(*where, *rule))
    return found


def mpi_violations(source, rule, forbidden, what):
    """Lines whose code (comments and literals out) names identifiers matching `forbidden`."""
    found = []
    for n, line in enumerate(source.code.split("\n"), 1):
        names = sorted(set(m.group() for m in forbidden.finditer(line)))
        if names:
            found.append(Violation(source.path, n, rule, f"{', '.join(names)}: {what}"))
    return found


def header_mpi_violations(source, rel):
    if matches(rel, MPI_ALLOWED):
        return []
    where = f"MPI only in {', '.join(MPI_ALLOWED)}"
    found = [Violation(source.path, inc.line, "mpi-outside-comm", f"#include <{inc.path}>: {where}")
             for inc in source.includes if inc.path in MPI_HEADERS]
    return found + mpi_violations(source, "mpi-outside-comm", _MPI_NAME, where)


def tool_violations(source, kshard_dir):
    """The tools' rules: public faces only, no MPI collective of their own."""
    found = []
    for inc in source.includes:
        target = kshard_target(inc, None, kshard_dir)
        if target is not None and not _exists(target, kshard_dir):
            found.append(Violation(source.path, inc.line, "missing-include",
                                   f"kshard/{target} does not exist"))
        elif target is not None and matches(target, TOOLS_FORBIDDEN_INCLUDES):
            found.append(Violation(source.path, inc.line, "tools-detail", f"kshard/{target} is "
                                   "internal: tools include the public faces only"))
    found += mpi_violations(source, "tools-raw-collective", re.compile(TOOLS_FORBIDDEN_MPI),
                            "tools leave collectives to kshard (an agreement or kshard call)")
    found += mpi_violations(source, "tools-detail", re.compile(TOOLS_FORBIDDEN_NAMESPACES),
                            "tools use the public API only, never a detail namespace")
    return found


def length_violations(source, functions):
    found = [Violation(source.path, f.line, "function-length", f"{f.name} is "
                       f"{count_convention(f)} lines (at most {MAX_FUNCTION_LINES}, from the "
                       "line of its name to its closing brace)")
             for f in functions if count_convention(f) > MAX_FUNCTION_LINES]
    return found


def check_file(path, kshard_dir, rel=None):
    """All violations of one file: a header under include/kshard/ (rel given) or a tool."""
    source = read_source(path)
    functions, problems = find_functions(source.code)
    found = length_violations(source, functions)
    found += [Violation(source.path, line, "braces", f"{what}: function lengths unsure here")
              for line, what in problems]
    if rel is None:
        return found + tool_violations(source, kshard_dir), functions
    if layer_of(rel) is None:
        found.append(Violation(source.path, 1, "not-in-table", f"{rel} is in no layer: place it "
                               "in LAYERS of tests/lint/layering.py"))
    found += include_violations(source, rel, kshard_dir) + header_mpi_violations(source, rel)
    return found, functions


# --- The command ----------------------------------------------------------------------------

def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="rules:" + RULES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--include", required=True, help="the folder that holds kshard/")
    parser.add_argument("--tools", help="the folder of the command-line tools' sources")
    parser.add_argument("--functions", action="store_true",
                        help="also list every function found, with its length")
    args = parser.parse_args(argv)
    kshard_dir = os.path.join(args.include, "kshard")
    for folder in (kshard_dir, args.tools):
        if folder is not None and not os.path.isdir(folder):
            parser.error(f"{folder} is not a folder")
    return args, kshard_dir


def main(argv=None):
    args, kshard_dir = parse_args(argv)
    headers = list_files(kshard_dir, HEADER_SUFFIXES)
    tools = list_files(args.tools, SOURCE_SUFFIXES) if args.tools else []
    violations, functions = [], []
    for path in headers + tools:
        rel = os.path.relpath(path, kshard_dir).replace(os.sep, "/") if path in headers else None
        found, defined = check_file(path, kshard_dir, rel)
        violations += found
        functions += [(os.path.normpath(path), f) for f in defined]
    if args.functions:
        for path, f in functions:
            print(f"{path}:{f.line}: {f.name} {count_convention(f)} lines")
    for v in sorted(set(violations)):
        print(f"{v.path}:{v.line}: {v.rule}: {v.message}")
    counts = collections.Counter(v.rule for v in violations)
    scope = f"{len(headers)} headers in {len(LAYERS)} layers, {len(tools)} tool sources, " \
            f"{len(functions)} functions"
    if violations:
        rules = ", ".join(f"{rule} {n}" for rule, n in sorted(counts.items()))
        print(f"layering: {len(violations)} violations ({rules}) in {scope}")
        return 1
    print(f"layering: ok: {scope}, none over {MAX_FUNCTION_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
