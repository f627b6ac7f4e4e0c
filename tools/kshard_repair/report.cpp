#include "report.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>

#include <fmt/ranges.h>

#include "kshard/comm/program_agreement.hpp"
#include "kshard/error.hpp"

namespace kshard_repair {

std::string id_list(const std::vector<kshard::index_t>& ids) {
  constexpr std::size_t shown = 16;
  if (ids.size() <= shown) return fmt::format("[{}]", fmt::join(ids, ", "));
  const std::vector<kshard::index_t> head(ids.begin(), ids.begin() + shown - 4);
  const std::vector<kshard::index_t> tail(ids.end() - 4, ids.end());
  return fmt::format("[{}, ... {} more ..., {}]", fmt::join(head, ", "), ids.size() - shown,
                     fmt::join(tail, ", "));
}

std::string summary(const kshard::RepairReport& report) {
  if (report.repaired_row_ids.size() <= 16) return fmt::format("{}", report);
  return fmt::format("{}: {} damaged row(s) {}; min norm before {:g}, target norm {:g}; kept {}",
                     report.input_name, report.repaired_row_ids.size(),
                     id_list(report.repaired_row_ids), report.min_norm_before,
                     report.target_norm.value_or(0.0), id_list(report.kept_row_ids));
}

namespace {

nlohmann::json number_or_null(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

nlohmann::json optional_number(const std::optional<double>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

}  // namespace

nlohmann::json report_json(const kshard::RepairReport& report, const std::vector<double>& after) {
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t k = 0; k < report.repaired_row_ids.size(); ++k) {
    const kshard::index_t id = report.repaired_row_ids[k];
    const bool relative =
        std::binary_search(report.relative_row_ids.begin(), report.relative_row_ids.end(), id);
    rows.push_back(
        {{"id", id},
         {"norm_before", number_or_null(report.repaired_norms_before[k])},
         {"norm_after", after.empty() ? nlohmann::json(nullptr) : number_or_null(after[k])},
         {"found_by", relative ? "relative" : "absolute"}});
  }
  return {{"rows", rows},
          {"kept_row_ids", report.kept_row_ids},
          {"target_norm", optional_number(report.target_norm)},
          {"median_norm", optional_number(report.median_norm)},
          {"min_norm_before", number_or_null(report.min_norm_before)},
          {"direction_from", report.output_name ? *report.output_name : "mean of healthy rows"}};
}

nlohmann::json hashes_json(const std::map<std::string, std::uint64_t>& hashes) {
  nlohmann::json result = nlohmann::json::object();
  for (const auto& [name, hash] : hashes) result[name] = fmt::format("fnv1a64:{:016x}", hash);
  return result;
}

void write_report(const kshard::comm::Group& group, const std::string& path,
                  const nlohmann::json& json, ReportWrite how) {
  std::optional<std::string> problem;
  if (group.rank() == 0) {
    // Paths and names are bytes, not always UTF-8: replaced (U+FFFD) rather than a throw on
    // rank 0 alone.
    const std::string text =
        json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + '\n';
    const int mode = how == ReportWrite::replace ? O_TRUNC : O_EXCL;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | mode, 0644);
    const bool written =
        fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    if (!written)
      problem = fmt::format("cannot write the report '{}': {}", path,
                            fd < 0 && errno == EEXIST
                                ? "it exists, and the run ended before its paths were checked"
                                : std::strerror(errno));
    if (fd >= 0) ::close(fd);
  }
  try {
    kshard::comm::throw_if_any(group, problem);
  } catch (const kshard::error& e) {
    throw Failure{usage_or_io, e.what(), false};
  }
}

int fail(const kshard::comm::Group& group, const Options& options, const Failure& failure,
         ReportWrite how) {
  const char* kind = failure.code == refused ? "refused" : "error";
  say("kshard-repair: {}: {}\n", kind, failure.message);
  if (!options.report.empty() && failure.report_writable) {
    try {
      write_report(group, options.report,
                   {{"status", kind},
                    {"message", failure.message},
                    {"exit_code", static_cast<int>(failure.code)}},
                   how);
    } catch (const Failure&) {  // the failure being reported is the one that matters
    }
  }
  return failure.code;
}

}  // namespace kshard_repair
