#pragma once

// What kshard-repair tells: progress and the summary on rank 0's stdout, the JSON report
// (--report), and the failures that end a run with their exit codes.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/console.hpp"
#include "kshard/comm/group.hpp"
#include "kshard/index.hpp"
#include "kshard/repair.hpp"
#include "options.hpp"

namespace kshard_repair {

// Every rank exits with the same code.
enum ExitCode { repaired_or_clean = 0, refused = 1, usage_or_io = 2 };

// A kshard::error with the exit code it ends the run with.
struct Failure {
  ExitCode code;
  std::string message;
  bool report_writable = true;  // false: the report path is the problem; leave it alone
};

using kshard_tools::say;
using kshard_tools::seconds_since;
using kshard_tools::throughput;
using kshard_tools::world_rank;

// Ids as "[a, b, c]", the middle of a long list left out.
std::string id_list(const std::vector<kshard::index_t>& ids);

// The report in one line: kshard's own printing, or counts when the lists are long.
std::string summary(const kshard::RepairReport& report);

// What the repair found and did, as JSON: each repaired row with its norm before and `after`
// (empty: not written) and the test that found it, the kept rows, the norms.
nlohmann::json report_json(const kshard::RepairReport& report, const std::vector<double>& after);

// Tensor hashes (io::tensor_hashes) as the report writes them, "fnv1a64:<16 hex digits>".
nlohmann::json hashes_json(const std::map<std::string, std::uint64_t>& hashes);

// How a report may be written: over a file only once check_paths has cleared its path (so it
// is no file the run reads or makes), before that only as a new file.
enum class ReportWrite { new_file_only, replace };

// Rank 0 writes `json` to the report file `path`; every rank of `group` learns whether it
// could (a Failure that leaves the report alone where it could not).
void write_report(const kshard::comm::Group& group, const std::string& path,
                  const nlohmann::json& json, ReportWrite how = ReportWrite::replace);

// Prints the failure (rank 0), records it in the report when there is one (`how`), and returns
// its exit code. Collective over `group` when there is a report.
int fail(const kshard::comm::Group& group, const Options& options, const Failure& failure,
         ReportWrite how);

}  // namespace kshard_repair
