#!/usr/bin/env python3
"""kshard-convert as a user sees it (issue 39, item 5): a folder of per-rank safetensors shards
of a 4-rank FSDP job (Shard(0) on every tensor) consolidated into a Hugging Face model, page-cached,
each command timed end to end (wall time, MPI start-up and interpreter start-up included) with the
peak resident memory of its processes (/usr/bin/time's %M, the maximum over the ranks of an
mpiexec run), against `cp -r` of the shard folder (the floor) and, when torch is importable,
torch's own consolidation (torch.distributed.checkpoint._consolidate_hf_safetensors).

    bench/convert_bench.py --size llama3-8b [--torch-python /tmp/tvenv/bin/python]
    bench/convert_bench.py --size small --repeat 1 --out /tmp/convert-small.json   (CI smoke)

Steps: the consolidated checkpoint is written with numpy and a raw safetensors writer (BF16 as
random uint16 bit patterns with the exponent's top bit cleared: finite, |x| < 2), checked with the
safetensors reader; the 4 per-rank shards are made from it by `mpiexec -n 1 kshard-convert IN
shards --to sharded --mesh 4 --layout 'Shard(0)'` (default) or, with --shards-by torch, by a 4-rank
gloo job saving DTensors through torch's HuggingFaceStorageWriter(save_distributed=True); the
shards are read once (cat > /dev/null) so every run finds them in the page cache. Then the cases
run in --repeat rounds (default 3), each case once per round, so that all of them see the
machine's load alike; the output is removed between runs; the table shows each case's best run
(the JSON keeps every run and the median). Every output is checked on the first round, tensor by
tensor, against the consolidated checkpoint.

Fresh memory: before each run, 1.5 times the tensor bytes of memory are touched and freed
(--prefault). On a virtual machine whose balloon device reports free memory to the host (free
page reporting, /sys/module/page_reporting), memory the guest has not touched for a few seconds
is given back, and faulting it in again is slow: on the 2-core KVM guest this was written on, a
2 GiB buffer filled at 0.45-0.65 GB/s after the machine idled, at 2.3-7.4 GB/s right after an
equal buffer was freed. Every case writes 2.2 GB of new page cache, so without this step its time
follows how long the machine idled before it (cp -r measured 0.7-3.3 s on the same files).

Durability: kshard-convert fsyncs every file it writes before it returns; cp and torch do not
(their bytes are still in the page cache when they exit). So after every run the output files
are fsynced (timed apart, `fsync_after_s`) and the table shows both the command as run and
"durable" (command + the fsync after it; kshard's is near zero), and kshard's commands also run
with --no-sync, which writes as cp does.

Speeds are bytes of tensor data over seconds (GB = 1e9 bytes); "x cp" is cp's time over the
case's (above 1: faster than cp). torch's consolidation writes all tensors into one file with
fqn_to_index_mapping all -> 1 at num_threads=1; its threads only work on different output files
(_write_data), so num_threads=2 runs with the tensors split between 2 files by bytes.

The repair (issue 39, item 7): the consolidated file with 64 embedding rows zeroed, repaired by
`kshard-repair FILE --out OUT` at 1 and 2 ranks (the untouched bytes moved as the conversion
moves them), against `cp` of the same file; the output must equal the input but for those rows.

PyTorch DCP (issue 40, item 7): the consolidated checkpoint written as the DCP of a 4-rank
Shard(0) job by kshard-convert --to dcp, converted to a Hugging Face model by kshard-convert at 1
and 2 ranks, against `cp -r` of the DCP folder and, with torch, what a torch user runs:
dcp_to_torch_save, torch.load (mmap) and safetensors' save_file.

The MPI environment is the caller's (scripts/deps.sh's kshard_mpi_environment, or
OMPI_ALLOW_RUN_AS_ROOT=1 ... for Open MPI as root). Exits 77 (skipped) when this python lacks
numpy or safetensors, 1 when an output differs from the input or a command fails.
"""

import argparse
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIME = "/usr/bin/time"

# name -> (shape, dtype) in name order, as a Llama checkpoint's tensors.
def llama_like(vocab, hidden, kv, layers=1):
    tensors = {"lm_head.weight": ([vocab, hidden], "BF16"),
               "model.embed_tokens.weight": ([vocab, hidden], "BF16"),
               "model.norm.weight": ([hidden], "BF16")}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = ([hidden], "BF16")
        tensors[p + "post_attention_layernorm.weight"] = ([hidden], "BF16")
        tensors[p + "self_attn.q_proj.weight"] = ([hidden, hidden], "BF16")
        tensors[p + "self_attn.k_proj.weight"] = ([kv, hidden], "BF16")
        tensors[p + "self_attn.v_proj.weight"] = ([kv, hidden], "BF16")
        tensors[p + "self_attn.o_proj.weight"] = ([hidden, hidden], "BF16")
    return dict(sorted(tensors.items()))


# Llama-3-8B's embedding and head (128256 x 4096 BF16, 1.05 GB each) and the attention and norms
# of one layer: 2.19 GB. The small one (54 MB) is the same shape of checkpoint for CI.
SIZES = {"llama3-8b": llama_like(128256, 4096, 1024), "small": llama_like(4000, 2048, 512)}
ELEMENT_BYTES = {"BF16": 2, "F16": 2, "F32": 4}
CHUNK = 64 << 20


def log(*args):
    print("[convert_bench]", *args, flush=True)


# ---------------------------------------------------------------- safetensors, raw


def read_header(path):
    """(header dict, offset of the data section) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def tensor_bytes(tensors):
    return sum(math.prod(shape) * ELEMENT_BYTES[dtype] for shape, dtype in tensors.values())


def write_consolidated(path, tensors, seed=39):
    """A safetensors file of `tensors`, written as a raw safetensors writer does: the header, then
    random-ish BF16 bit patterns (a random 64 MiB pool XORed with a per-chunk constant, the
    exponent's top bit cleared: finite values of magnitude below 2)."""
    import numpy as np
    header, at = {"__metadata__": {"format": "pt"}}, 0
    for name, (shape, dtype) in tensors.items():
        size = math.prod(shape) * ELEMENT_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + size]}
        at += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 1 << 16, size=CHUNK // 2, dtype=np.uint16)
    chunk = np.empty_like(pool)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        k = 0
        for name, (shape, dtype) in tensors.items():
            left = math.prod(shape) * ELEMENT_BYTES[dtype] // 2
            while left:
                n = min(left, pool.size)
                np.bitwise_xor(pool[:n], np.uint16((k * 0x9E37) & 0xFFFF), out=chunk[:n])
                chunk[:n] &= 0xBFFF
                f.write(memoryview(chunk[:n]).cast("B"))
                left -= n
                k += 1


def check_with_safetensors(path, tensors):
    """The reference reader agrees with the raw writer on every name, dtype and shape."""
    from safetensors import safe_open
    with safe_open(path, framework="np") as f:
        names = sorted(f.keys())
        if names != sorted(tensors):
            raise SystemExit(f"safetensors reads {names}, not {sorted(tensors)}")
        for name in names:
            s = f.get_slice(name)
            if (list(s.get_shape()), s.get_dtype()) != (tensors[name][0], tensors[name][1]):
                raise SystemExit(f"safetensors reads {name} as {s.get_dtype()} "
                                 f"{s.get_shape()}, not {tensors[name]}")


def output_files(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".safetensors"))


def compare_with(reference, folder):
    """Every tensor of the consolidated `reference` has the same dtype, shape and bytes in the
    safetensors files of `folder` (consolidated output), and nothing else is there."""
    import numpy as np
    ref_header, ref_base = read_header(reference)
    ref = np.memmap(reference, dtype=np.uint8, mode="r")
    seen = set()
    for path in output_files(folder):
        header, base = read_header(path)
        data = np.memmap(path, dtype=np.uint8, mode="r")
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            want = ref_header.get(name)
            if want is None or (entry["dtype"], entry["shape"]) != (want["dtype"], want["shape"]):
                raise SystemExit(f"{path}: {name} is {entry}, the input holds {want}")
            (a, b), (c, d) = entry["data_offsets"], want["data_offsets"]
            for at in range(0, b - a, CHUNK):
                n = min(CHUNK, b - a - at)
                if not np.array_equal(data[base + a + at:base + a + at + n],
                                      ref[ref_base + c + at:ref_base + c + at + n]):
                    raise SystemExit(f"{path}: the bytes of {name} differ from the input's")
            seen.add(name)
        del data
    missing = set(ref_header) - {"__metadata__"} - seen
    if missing:
        raise SystemExit(f"{folder} lacks {sorted(missing)}")


def damage_rows(path, name, rows):
    """Zeroes `rows` rows of tensor `name` of the safetensors file at `path` (in place); returns
    the byte ranges it zeroed."""
    header, base = read_header(path)
    entry = header[name]
    row_bytes = math.prod(entry["shape"][1:]) * ELEMENT_BYTES[entry["dtype"]]
    ranges = [(base + entry["data_offsets"][0] + r * row_bytes,
               base + entry["data_offsets"][0] + (r + 1) * row_bytes) for r in rows]
    with open(path, "r+b") as f:
        for begin, end in ranges:
            f.seek(begin)
            f.write(bytes(end - begin))
    return ranges


def check_repaired(damaged, repaired, ranges):
    """`repaired` has `damaged`'s bytes everywhere but the zeroed `ranges`, none of which is
    still all zero."""
    import numpy as np
    a = np.memmap(damaged, dtype=np.uint8, mode="r")
    b = np.memmap(repaired, dtype=np.uint8, mode="r")
    if a.size != b.size:
        raise SystemExit(f"{repaired} is {b.size} bytes, the input {a.size}")
    at = 0
    for begin, end in sorted(ranges) + [(a.size, a.size)]:
        for x in range(at, begin, CHUNK):
            y = min(begin, x + CHUNK)
            if not np.array_equal(a[x:y], b[x:y]):
                raise SystemExit(f"{repaired} differs from the input in bytes [{x}, {y})")
        if begin < end and not b[begin:end].any():
            raise SystemExit(f"{repaired}: the damaged bytes [{begin}, {end}) are still zero")
        at = end


def check_shards(folder, tensors, ranks=4):
    """`ranks` per-rank files, each with DCP_SHARDING_INFO, every tensor's rows tiled."""
    files = [f for f in output_files(folder) if os.path.basename(f).startswith("shard-")]
    if len(files) != ranks:
        raise SystemExit(f"{folder} holds {len(files)} per-rank shards, not {ranks}")
    rows = {name: 0 for name in tensors}
    for path in files:
        header, _ = read_header(path)
        info = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
        for name in tensors:
            if name in header:
                rows[name] += header[name]["shape"][0]
                if name not in info:
                    raise SystemExit(f"{path}: DCP_SHARDING_INFO does not place {name}")
    for name, (shape, _) in tensors.items():
        if rows[name] != shape[0]:
            raise SystemExit(f"the shards hold {rows[name]} rows of {name}, not {shape[0]}")


# ---------------------------------------------------------------- timing


def have_time():
    return os.access(TIME, os.X_OK)


def rank_timer(folder):
    """The words that run a rank under /usr/bin/time, its figures to a file of its own in
    `folder` (Open MPI forwards the ranks' stderr in pieces that interleave)."""
    if not have_time():
        return []
    return ["sh", "-c", 'f="$1/rank.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-$$}}"; shift; '
            'exec "$0" -o "$f" -f "%e %M" "$@"', TIME, folder]


def timed(what, command, timer=None):
    """Runs `command` (a list) under /usr/bin/time: returns the wall seconds (perf_counter around
    it), the peak RSS in KiB of the largest process measured (the ranks when `timer`, the folder
    that rank_timer's ranks write to, else the command), each rank's seconds, and what the
    command printed. Fails the benchmark when the command fails."""
    figures = tempfile.mkdtemp(prefix="kshard-bench-time-")
    outer = [TIME, "-o", os.path.join(figures, "outer"), "-f", "%e %M"] if have_time() else []
    try:
        start = time.perf_counter()
        p = subprocess.run(outer + command, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if p.returncode != 0:
            sys.stderr.write(p.stdout + p.stderr)
            raise SystemExit(f"{what} failed (exit code {p.returncode}): {shlex.join(command)}")
        measured = {}
        for name in os.listdir(figures):
            with open(os.path.join(figures, name)) as f:
                elapsed, rss = f.read().split()[-2:]  # after any 'Command exited ...' line
                measured[name] = (float(elapsed), int(rss))
        if timer:
            for name in os.listdir(timer):
                with open(os.path.join(timer, name)) as f:
                    elapsed, rss = f.read().split()[-2:]
                    measured[name] = (float(elapsed), int(rss))
                os.remove(os.path.join(timer, name))
    finally:
        shutil.rmtree(figures, ignore_errors=True)
    ranks = [v for k, v in sorted(measured.items()) if k.startswith("rank.")]
    rss = [v[1] for v in ranks] if timer else [v[1] for k, v in measured.items() if k == "outer"]
    return {"seconds": seconds,
            "peak_rss_kib": max(rss) if rss else None,
            "rank_seconds": [v[0] for v in ranks] or None,
            "output": (p.stdout + p.stderr).strip()}


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_files(path):
    """fsyncs the file `path`, or every file under the folder `path` and the folder itself;
    returns the seconds it took."""
    start = time.perf_counter()
    if os.path.isfile(path):
        fsync_path(path)
    for root, _, names in os.walk(path):
        for name in names:
            fsync_path(os.path.join(root, name))
        fsync_path(root)
    return time.perf_counter() - start


def remove(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def free_page_reporting():
    """Whether this (virtual) machine reports freed memory to its host (virtio-balloon free page
    reporting): memory touched again after that is slow to fault in."""
    return os.path.isdir("/sys/module/page_reporting")


def prefault(nbytes):
    """Touches `nbytes` of memory and frees it: the pages the next command takes for its page
    cache and buffers are then ones the guest has just used, not ones its host took back."""
    if nbytes > 0:
        import numpy as np
        block = np.ones(nbytes, dtype=np.uint8)
        del block


class Case:
    """One command to time: its record's fields, and how to check its output."""

    def __init__(self, case, label, command, verify=None, timer=None, out=None, **fields):
        self.case, self.label, self.command, self.out = case, label, command, out
        self.verify, self.timer, self.fields, self.runs = verify, timer, fields, []

    def run(self, out, first, prefault_bytes):
        """One run, which writes the new `out` (the case's own when it names one): timed, its
        output fsynced (timed apart), checked on the `first` run, then removed."""
        out = self.out or out
        remove(out)
        prefault(prefault_bytes)
        run = timed(self.case, self.command, self.timer)
        run["fsync_after_s"] = fsync_files(out)
        if first and self.verify:
            self.verify(out)
        remove(out)
        self.runs.append(run)
        log(f"{self.case} {self.fields}: {run['seconds']:.3f} s (+ fsync "
            f"{run['fsync_after_s']:.3f} s), peak RSS {run['peak_rss_kib']} KiB")

    def record(self):
        runs = self.runs
        best = min(runs, key=lambda r: r["seconds"])
        record = {"bench": "convert", "case": self.case, "label": self.label, **self.fields,
                  "seconds": best["seconds"],
                  "seconds_median": statistics.median(r["seconds"] for r in runs),
                  "seconds_all": [round(r["seconds"], 4) for r in runs],
                  "fsync_after_s": best["fsync_after_s"],
                  "fsync_after_all": [round(r["fsync_after_s"], 4) for r in runs],
                  "durable_seconds": min(r["seconds"] + r["fsync_after_s"] for r in runs),
                  "peak_rss_mib": None if best["peak_rss_kib"] is None else
                  max(r["peak_rss_kib"] for r in runs) / 1024,
                  "command": shlex.join(self.command)}
        if best["rank_seconds"]:
            record["rank_seconds"] = best["rank_seconds"]
        if best["output"]:
            record["says"] = best["output"].splitlines()[-1]
            # The work itself, as the command times it: kshard-convert's "... in X s (...)" (from
            # reading the checkpoint's headers to the folder published), torch's call.
            work = re.search(r" in ([0-9.]+) s \(|(?:consolidate_safetensors_files|"
                             r"dcp_to_torch_save \+ save_file) ([0-9.]+) s", record["says"])
            if work:
                record["work_seconds"] = float(work.group(1) or work.group(2))
        return record


# ---------------------------------------------------------------- torch (in --torch-python)


def torch_consolidate(shards, out, threads, files):
    """Run by --torch-python: torch's consolidation of `shards` into `out` (made here), all
    tensors into one file, or split into `files` files by bytes. Prints its import and call
    times."""
    start = time.perf_counter()
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files)
    imported = time.perf_counter()
    names = {}
    for path in output_files(shards):
        header, _ = read_header(path)
        for name, entry in header.items():
            if name != "__metadata__":
                names[name] = names.get(name, 0) + math.prod(entry["shape"])
    mapping, load = {}, [0] * files
    for name in sorted(names, key=lambda n: (-names[n], n)):  # largest first, to the lightest
        i = load.index(min(load))
        mapping[name] = i + 1
        load[i] += names[name]
    os.makedirs(out)
    consolidate_safetensors_files(shards, out, fqn_to_index_mapping=mapping, num_threads=threads)
    done = time.perf_counter()
    print(f"torch: import {imported - start:.3f} s, consolidate_safetensors_files "
          f"{done - imported:.3f} s")


def torch_dcp_to_hf(dcp_dir, out):
    """Run by --torch-python: what a torch user runs to turn a DCP into a Hugging Face model:
    dcp_to_torch_save (one torch.save file of the whole state dict), torch.load, then
    safetensors' save_file. Prints its import and call times."""
    start = time.perf_counter()
    import torch
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    imported = time.perf_counter()
    os.makedirs(out)
    whole = os.path.join(out, "whole.pt")
    dcp_to_torch_save(dcp_dir, whole)
    state = torch.load(whole, weights_only=True, mmap=True)
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    os.remove(whole)
    done = time.perf_counter()
    print(f"torch: import {imported - start:.3f} s, dcp_to_torch_save + save_file "
          f"{done - imported:.3f} s")


def torch_write_rank(rank, world, consolidated, out, port):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors import safe_open
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    state = {}
    with safe_open(consolidated, framework="pt") as f:
        for name in f.keys():
            s = f.get_slice(name)
            shape = s.get_shape()
            chunk = -(-shape[0] // world)  # torch.chunk's split, as Shard(0) makes it
            local = s[min(rank * chunk, shape[0]):min((rank + 1) * chunk, shape[0])]
            state[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                             shape=torch.Size(shape),
                                             stride=torch.empty(shape, device="meta").stride())
    dcp.save(state, storage_writer=HuggingFaceStorageWriter(path=out, save_distributed=True))
    dist.destroy_process_group()


def torch_write_shards(consolidated, out, world=4):
    """Run by --torch-python: the shards a 4-rank FSDP job writes (gloo on CPU)."""
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(torch_write_rank, args=(world, consolidated, out, port), nprocs=world)


# ---------------------------------------------------------------- the benchmark


def repair_cases(consolidated, scratch, repair, mpiexec, timer, common, rows=64):
    """Item 7: `kshard-repair --out` of one consolidated file with `rows` zeroed embedding rows
    (spread over the vocabulary) at 1 and 2 ranks, beside `cp` of the same file."""
    damaged = os.path.join(scratch, "damaged.safetensors")
    shutil.copyfile(consolidated, damaged)
    vocab = SIZES[common["size"]]["model.embed_tokens.weight"][0][0]
    ranges = damage_rows(damaged, "model.embed_tokens.weight",
                         [r * (vocab // rows) + 7 for r in range(rows)])
    subprocess.run(["cat", damaged], stdout=subprocess.DEVNULL, check=True)
    fsync_files(damaged)
    verify = lambda out: check_repaired(damaged, out, ranges)  # noqa: E731
    out = os.path.join(scratch, "repaired.safetensors")
    cases = [Case("cp_file", "`cp` of the damaged model file", ["cp", damaged, out], out=out,
                  **common)]
    for flags, case, label in ((), "kshard_repair_out", "kshard-repair --out"), \
            (("--no-sync",), "kshard_repair_out_nosync", "kshard-repair --out --no-sync"):
        for np_ in (1, 2):
            cases.append(Case(case, f"{label} ({rows} damaged rows)",
                              mpiexec + [str(np_)] + rank_timer(timer) +
                              [repair, damaged, "--out", out, *flags], verify, timer, out,
                              ranks=np_, **common))
    return cases


def dcp_cases(consolidated, scratch, convert, mpiexec, timer, common, torch_python, verify):
    """Issue 40, item 7: the benchmark checkpoint as the DCP of a 4-rank Shard(0) job (written
    by kshard-convert --to dcp; torch loads such folders, tests/io/torch_interop.sh), converted
    to a Hugging Face model at 1 and 2 ranks, beside `cp -r` of the DCP folder and torch's
    dcp_to_torch_save + save_file."""
    dcp = os.path.join(scratch, "dcp")
    timed("kshard-convert --to dcp", mpiexec + ["1", convert, consolidated, dcp, "--to", "dcp",
                                                "--mesh", "4", "--quiet"])
    files = [os.path.join(dcp, f) for f in os.listdir(dcp)]
    subprocess.run(["sh", "-c", 'cat "$@" > /dev/null', "cat"] + files, check=True)
    fsync_files(dcp)
    out = os.path.join(scratch, "dcp_out")
    cases = [Case("cp_dcp", "`cp -r` of the DCP folder", ["cp", "-r", dcp, out], out=out,
                  **common)]
    for np_ in (1, 2):
        cases.append(Case("kshard_convert_dcp_hf", "kshard-convert DCP --to hf",
                          mpiexec + [str(np_)] + rank_timer(timer) + [convert, dcp, out, "--quiet"],
                          verify, timer, out, ranks=np_, **common))
    if torch_python:
        cases.append(Case("torch_dcp_to_hf", "torch dcp_to_torch_save + save_file",
                          [torch_python, os.path.abspath(__file__), "_torch-dcp-to-hf", dcp, out],
                          verify, out=out, threads=1, output_files=1, **common))
    return cases


def table(records):
    def f(x, digits=2):
        return "n/a" if x is None else f"{x:.{digits}f}"
    rows = ["| case | ranks / threads | best s (median) | GB/s | x cp | + fsync s | durable x cp "
            "| peak RSS MiB (per process) | work s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        who = (f"{r['ranks']} rank{'s' if r['ranks'] > 1 else ''}" if "ranks" in r else
               f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}, {r['output_files']} "
               f"file{'s' if r['output_files'] > 1 else ''}" if "threads" in r else "-")
        rows.append(f"| {r['label']} | {who} | {f(r['seconds'])} ({f(r['seconds_median'])}) "
                    f"| {f(r['gbps'])} | {f(r['speed_vs_cp'])} "
                    f"| {f(r['fsync_after_s'])} "
                    f"| {f(r['durable_speed_vs_cp'])} "
                    f"| {f(r['peak_rss_mib'], 0)} | {f(r.get('work_seconds'), 3)} |")
    return "\n".join(rows)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_torch-consolidate":
        return torch_consolidate(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    if len(sys.argv) > 1 and sys.argv[1] == "_torch-write-shards":
        return torch_write_shards(sys.argv[2], sys.argv[3])
    if len(sys.argv) > 1 and sys.argv[1] == "_torch-dcp-to-hf":
        return torch_dcp_to_hf(sys.argv[2], sys.argv[3])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (best is shown)")
    parser.add_argument("--kshard-convert",
                        default=os.path.join(REPO, "build/serial/tools/kshard-convert"))
    parser.add_argument("--kshard-repair",
                        default=os.path.join(REPO, "build/serial/tools/kshard-repair"))
    parser.add_argument("--mpiexec", default="mpiexec")
    parser.add_argument("--np-flag", default="-n", help="mpiexec's process-count flag")
    parser.add_argument("--torch-python", help="a python that imports torch: adds torch's cases")
    parser.add_argument("--shards-by", choices=("kshard", "torch"), default="kshard",
                        help="who writes the per-rank shards (torch: needs --torch-python)")
    parser.add_argument("--prefault", type=float, default=1.5,
                        help="before each run, touch and free this many times the tensor bytes of "
                        "memory (0: not); see free_page_reporting (default 1.5)")
    parser.add_argument("--scratch", help="folder for the files (default: a new one in $TMPDIR, "
                        "removed at the end)")
    parser.add_argument("--out", help="the JSON to write (default for llama3-8b: "
                        "bench/results/convert.json; none for small)")
    args = parser.parse_args()
    try:
        import numpy  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError as e:
        print(f"convert_bench: skipped: {e} (pip install numpy safetensors)")
        return 77
    if args.shards_by == "torch" and not args.torch_python:
        parser.error("--shards-by torch needs --torch-python")
    out_json = args.out or (os.path.join(REPO, "bench/results/convert.json")
                            if args.size == "llama3-8b" else None)
    tensors = SIZES[args.size]
    data_bytes = tensor_bytes(tensors)
    scratch = args.scratch or tempfile.mkdtemp(prefix="kshard-convert-bench-")
    os.makedirs(scratch, exist_ok=True)
    convert = os.path.abspath(args.kshard_convert)
    mpiexec = [args.mpiexec, args.np_flag]
    if not have_time():
        log(f"{TIME} is missing: no peak memory figures")
    try:
        consolidated = os.path.join(scratch, "consolidated.safetensors")
        shards = os.path.join(scratch, "shards")
        start = time.perf_counter()
        write_consolidated(consolidated, tensors)
        check_with_safetensors(consolidated, tensors)
        log(f"{args.size}: {len(tensors)} tensors, {data_bytes / 1e9:.3f} GB of tensor data "
            f"written in {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        if args.shards_by == "torch":
            writer = ("torch (4-rank gloo job, dcp.save, "
                      "HuggingFaceStorageWriter(save_distributed=True))")
            timed("torch's shard writer", [args.torch_python, os.path.abspath(__file__),
                                           "_torch-write-shards", consolidated, shards])
        else:
            writer = "kshard-convert --to sharded --mesh 4 --layout 'Shard(0)' (default)"
            timed("kshard-convert --to sharded",
                  mpiexec + ["1", convert, consolidated, shards, "--to", "sharded", "--mesh", "4",
                             "--layout", "Shard(0)", "--quiet"])
        check_shards(shards, tensors)
        log(f"shards of a 4-rank Shard(0) job written by {writer} in "
            f"{time.perf_counter() - start:.1f} s")
        shard_files = sorted(os.path.join(shards, f) for f in os.listdir(shards))
        subprocess.run(["sh", "-c", 'cat "$@" > /dev/null', "cat"] + shard_files, check=True)
        fsync_files(shards)  # nothing of the set-up left to write back during the runs
        verify = lambda folder: compare_with(consolidated, folder)  # noqa: E731
        out = os.path.join(scratch, "out")
        common = {"size": args.size, "tensor_bytes": data_bytes}
        timer = os.path.join(scratch, "rank-times")
        os.makedirs(timer)
        cases = [Case("cp", "`cp -r` of the shard folder", ["cp", "-r", shards, out], **common)]
        for flags, case, label in ((), "kshard_convert_hf", "kshard-convert --to hf"), \
                (("--no-sync",), "kshard_convert_hf_nosync", "kshard-convert --to hf --no-sync"):
            for np_ in (1, 2):
                cases.append(Case(case, label, mpiexec + [str(np_)] + rank_timer(timer) +
                                  [convert, shards, out, "--quiet", *flags], verify, timer,
                                  ranks=np_, **common))
        cases += repair_cases(consolidated, scratch, os.path.abspath(args.kshard_repair),
                              mpiexec, timer, common)
        cases += dcp_cases(consolidated, scratch, convert, mpiexec, timer, common,
                           args.torch_python, verify)
        if args.torch_python:
            for threads, files in ((1, 1), (2, 2)):
                cases.append(Case("torch_consolidate", "torch consolidate_safetensors_files",
                                  [args.torch_python, os.path.abspath(__file__),
                                   "_torch-consolidate", shards, out, str(threads), str(files)],
                                  verify, threads=threads, output_files=files, **common))
        # Round after round, every case once in each: all see the machine's load alike.
        prefault_bytes = int(args.prefault * data_bytes)
        for i in range(args.repeat):
            for case in cases:
                case.run(out, i == 0, prefault_bytes)
        records = [case.record() for case in cases]
        floors = {r["case"]: r for r in records if r["case"] in ("cp", "cp_file", "cp_dcp")}
        floor_of = {"cp_file": "cp_file", "kshard_repair_out": "cp_file",
                    "kshard_repair_out_nosync": "cp_file", "cp_dcp": "cp_dcp",
                    "kshard_convert_dcp_hf": "cp_dcp", "torch_dcp_to_hf": "cp_dcp"}
        for r in records:
            cp = floors[floor_of.get(r["case"], "cp")]
            r["gbps"] = data_bytes / r["seconds"] / 1e9
            r["durable_gbps"] = data_bytes / r["durable_seconds"] / 1e9
            r["speed_vs_cp"] = cp["seconds"] / r["seconds"]
            r["durable_speed_vs_cp"] = cp["durable_seconds"] / r["durable_seconds"]
            r["shards_by"] = args.shards_by
    finally:
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    machine = {"cpus": os.cpu_count(), "kernel": platform.release(),
               "load_average": os.getloadavg(), "free_page_reporting": free_page_reporting(),
               "prefault_bytes": prefault_bytes}
    for r in records:
        r["machine"] = machine
    report = [f"### kshard-convert, {args.size}: {data_bytes / 1e9:.2f} GB of BF16 in 4 per-rank "
              f"shards (Shard(0)), page-cached, best of {args.repeat} rounds\n"]
    report.append(f"Shards written by {writer}. GB/s: tensor bytes / wall time. x cp: cp's time / the "
          f"case's (for kshard-repair --out, cp of the damaged file; for the DCP cases, cp -r of the DCP folder). + fsync: fsync of the output after the command (kshard-convert fsyncs "
          f"before it exits; cp and torch do not); durable x cp: with it. Peak RSS: the largest "
          f"process (the largest rank under mpiexec). Work s: the conversion as the command "
          f"times it itself (kshard-convert's own report, torch's call without the interpreter "
          f"and its import), in the best run. Before each run {prefault_bytes / 1e9:.1f} GB of "
          f"memory was touched and freed (--prefault; this machine "
          f"{'reports' if free_page_reporting() else 'does not report'} free memory to a host).\n")
    report.append(table(records))
    if not args.torch_python:
        report.append("\n(torch's cases: --torch-python PYTHON, a python that imports torch)")
    print("\n" + "\n".join(report))
    if out_json:
        os.makedirs(os.path.dirname(os.path.abspath(out_json)), exist_ok=True)
        with open(out_json, "w") as f:
            f.write("[\n" + ",\n".join("  " + json.dumps(r) for r in records) + "\n]\n")
        with open(os.path.splitext(out_json)[0] + ".md", "w") as f:  # for bench/render.py
            f.write("\n".join(report) + "\n")
        log(f"wrote {out_json} and its table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
