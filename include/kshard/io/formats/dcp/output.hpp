#pragma once

// The PyTorch DCP a conversion writes (io::convert_checkpoint to OutputForm::dcp, or a DCP
// copied as stored): data files of torch.save archives back to back, one per box of a tensor
// (its storage row-major), the bytes items after the first file's archives, and `.metadata`
// naming where each lies. The archives' ZIP records do not change size with their contents, so
// every file is laid out before any byte moves; rank 0 writes the records with CRC-32 0 when it
// creates the files, and again with each storage's CRC once every rank has written (and
// checksummed) its share. Layout is pure arithmetic; only the last two steps do I/O.

#include <fcntl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kshard/comm/group.hpp"
#include "kshard/io/engine/byte_mover.hpp"
#include "kshard/io/engine/conversion_plan.hpp"
#include "kshard/io/engine/posix.hpp"
#include "kshard/io/formats/dcp/metadata.hpp"
#include "kshard/io/formats/dcp/metadata_pickle.hpp"
#include "kshard/io/torch/zip.hpp"

namespace kshard::detail {

// The folder of a torch.save archive written to a stream, as DCP's writer saves each item.
inline constexpr std::string_view dcp_archive_folder = "archive/";

// The archive holding output tensor `box`, whose storage's CRC-32 is `crc`.
inline TorchArchive dcp_box_archive(const OutputTensor& box, std::uint32_t crc) {
  return torch_archive(dcp_archive_folder, tensor_data_pickle(box.tensor->dtype, box.shape),
                       TorchStorage{box.bytes(), crc});
}

// The DCP data file `name`: an archive for each of `boxes`, then the bytes of `items`.
inline OutputFile dcp_output_file(std::string name, std::vector<OutputTensor> boxes,
                                  const std::vector<const io::StoredItem*>& items) {
  OutputFile file{std::move(name), 0, {}, {}, {}, true};
  for (OutputTensor& box : boxes) {
    TorchArchive archive = dcp_box_archive(box, 0);  // the CRC comes once the bytes are written
    box.at = file.size + archive.storage_offset;
    file.framing.push_back({file.size, std::move(archive.head)});
    file.framing.push_back({box.at + archive.storage_size, std::move(archive.tail)});
    file.size += archive.length;
  }
  file.tensors = std::move(boxes);
  for (const io::StoredItem* item : items) {
    file.items.push_back({item, file.size});
    file.size += item->bytes;
  }
  return file;
}

// Drops from `split` the empty boxes at offsets an earlier box of their tensor starts at (ranks
// past a short tensor's end): `.metadata` keys chunks by their offsets, and torch saves such a
// chunk once.
inline void drop_repeated_empty_boxes(RankBoxes& split) {
  std::set<std::pair<std::string, std::vector<std::int64_t>>> seen;
  for (auto& [rank, boxes] : split)
    std::erase_if(boxes, [&](const OutputTensor& box) {
      return !seen.emplace(box.tensor->name, box.offsets).second && box.bytes() == 0;
    });
}

// Per-rank DCP files of `split`, as `dcp.save` writes them: `__<rank>_0.distcp` for each rank
// holding boxes; the bytes `items` go to the first file (rank 0's, which holds a box of every
// tensor a mesh splits).
inline std::vector<OutputFile> plan_dcp(RankBoxes split, const std::vector<io::StoredItem>& items) {
  std::vector<const io::StoredItem*> carried;
  for (const io::StoredItem& item : items) carried.push_back(&item);
  drop_repeated_empty_boxes(split);
  std::vector<OutputFile> files;
  for (auto& [rank, held] : split)
    if (!held.empty() || (files.empty() && !carried.empty()))
      files.push_back(
          dcp_output_file(fmt::format("__{}_0.distcp", rank), std::move(held),
                          files.empty() ? carried : std::vector<const io::StoredItem*>{}));
  return files;
}

// A DCP checkpoint's own data files, with their names, pieces and items.
inline std::vector<OutputFile> plan_dcp_as_stored(const io::StoredContents& model) {
  std::vector<OutputFile> files;
  for (auto& [f, boxes] : stored_split(model)) {
    const auto file = static_cast<std::size_t>(f);
    std::vector<const io::StoredItem*> items;
    for (const io::StoredItem& item : model.other_items)
      if (item.file == file) items.push_back(&item);
    files.push_back(
        dcp_output_file(model.data_files[file].path.filename().string(), std::move(boxes), items));
  }
  return files;
}

// The `.metadata` of DCP `files`: each tensor's chunks (in name order) and each item, with the
// archive or bytes that hold it.
inline DcpMetadata dcp_output_metadata(const std::vector<OutputFile>& files) {
  std::map<std::string, DcpTensorEntry> tensors;
  DcpMetadata metadata;
  for (const OutputFile& file : files) {
    for (const OutputTensor& box : file.tensors) {
      const io::StoredTensor& tensor = *box.tensor;
      DcpTensorEntry& entry = tensors[tensor.name];
      if (entry.fqn.empty()) entry = {tensor.name, tensor.dtype, tensor.shape, {}};
      const TorchArchive archive = dcp_box_archive(box, 0);
      entry.chunks.push_back(
          {box.offsets, box.shape, {file.name, box.at - archive.storage_offset, archive.length}});
    }
    for (const OutputItem& item : file.items)
      metadata.bytes_items.push_back({item.item->name, {file.name, item.at, item.item->bytes}});
  }
  for (auto& [name, entry] : tensors) metadata.tensors.push_back(std::move(entry));
  return metadata;
}

// Rank 0: the CRC-32 of every output tensor (crcs[f][t]: tensor t of file f) from each rank's
// CRCs of its stretches (`mine`: this rank's, in stretches_of order), gathered; empty on the
// other ranks. The shares cut each tensor in rank order, so the parts combine in that order.
inline std::vector<std::vector<std::uint32_t>> gather_checksums(
    const comm::Group& group, const std::vector<OutputFile>& files,
    const std::vector<std::uint32_t>& mine) {
  std::vector<std::vector<Stretch>> stretches;
  std::vector<int> counts, displs;
  if (group.rank() == 0)
    for (int r = 0; r < group.size(); ++r) {
      stretches.push_back(stretches_of(files, r, group.size()));
      displs.push_back(r == 0 ? 0 : displs.back() + counts.back());
      counts.push_back(static_cast<int>(stretches.back().size()));
    }
  std::vector<std::uint32_t> all(group.rank() == 0 ? displs.back() + counts.back() : 0);
  group.gatherv(mine.data(), static_cast<std::int64_t>(mine.size()), all.data(), counts.data(),
                displs.data(), 0);
  std::vector<std::vector<std::uint32_t>> crcs;
  for (const OutputFile& file : files) crcs.emplace_back(file.tensors.size(), 0);
  std::size_t next = 0;
  for (const auto& rank_stretches : stretches)
    for (const Stretch& s : rank_stretches) {
      std::uint32_t& crc =
          crcs[s.file][static_cast<std::size_t>(s.tensor - files[s.file].tensors.data())];
      const std::uint64_t bytes =
          static_cast<std::uint64_t>(s.end - s.begin) * io::dtype_size(s.tensor->tensor->dtype);
      crc = zip_crc32_combine(crc, all[next++], bytes);
    }
  return crcs;
}

// Rank 0: rewrites the ZIP records of every archive of `files` (in `partial`) with its
// storage's CRC-32 from `crcs`, and syncs them.
inline void write_archive_checksums(const std::filesystem::path& partial,
                                    const std::vector<OutputFile>& files,
                                    const std::vector<std::vector<std::uint32_t>>& crcs) {
  for (std::size_t f = 0; f < files.size(); ++f) {
    if (!files[f].archives || files[f].tensors.empty()) continue;
    const auto path = partial / files[f].name;
    const ScopedFd fd(open_or_throw(path, O_WRONLY | O_CLOEXEC));
    for (std::size_t t = 0; t < files[f].tensors.size(); ++t) {
      const OutputTensor& box = files[f].tensors[t];
      const TorchArchive archive = dcp_box_archive(box, crcs[f][t]);
      pwrite_exactly(fd.get(), archive.head.data(), archive.head.size(),
                     box.at - archive.storage_offset, path);
      pwrite_exactly(fd.get(), archive.tail.data(), archive.tail.size(),
                     box.at + archive.storage_size, path);
    }
    fsync_or_throw(fd.get(), path);
  }
}

// Rank 0: writes `.metadata` for DCP `files` into `partial`, durably.
inline void write_dcp_metadata(const std::filesystem::path& partial,
                               const std::vector<OutputFile>& files) {
  const std::vector<std::byte> pickle = dcp_metadata_pickle(dcp_output_metadata(files));
  const auto path = partial / ".metadata";
  const ScopedFd fd(open_or_throw(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC));
  pwrite_exactly(fd.get(), pickle.data(), pickle.size(), 0, path);
  fsync_or_throw(fd.get(), path);
}

}  // namespace kshard::detail
