// The program tests/io/kill/sigkill_test.sh kills in the middle of a write:
//   kill_target make FILE ROWS     a checkpoint with one ROWS x 1024 F32 tensor "w" (rank 0)
//   kill_target copy FILE TARGET   read "w" (rows sharded) and write a new checkpoint
//   kill_target rows FILE          write every 2nd row back in place (undo file FILE.undo)
//   kill_target undo FILE          restore FILE from FILE.undo

#include <mpi.h>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "kshard/io/safetensors.hpp"

namespace {

namespace io = kshard::io;
using kshard::index_t;

void make(const std::string& path, index_t rows) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  const std::vector<io::TensorSpec> specs{{"w", io::Dtype::F32, {rows, 1024}}};
  const auto header = io::serialize_safetensors_header(io::make_safetensors_header(specs));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(header.data()),
            static_cast<std::streamsize>(header.size()));
  std::vector<float> row(1024);
  for (index_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < row.size(); ++c)
      row[c] = static_cast<float>(r) + 1e-3f * static_cast<float>(c);
    out.write(reinterpret_cast<const char*>(row.data()),
              static_cast<std::streamsize>(row.size() * 4));
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const std::vector<std::string> args(argv + 1, argv + argc);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const kshard::Mesh<1> mesh(MPI_COMM_WORLD, {size});
    const kshard::Layout layout(kshard::Shard<0>{});
    try {
      if (args.at(0) == "make") {
        make(args.at(1), std::stoll(args.at(2)));
      } else if (args.at(0) == "undo") {
        io::undo_in_place(mesh, args.at(1) + ".undo");
      } else {
        const io::SafetensorsFile file(mesh, args.at(1));
        const auto w = io::read_matrix<float>(file, "w", mesh, layout);
        if (args.at(0) == "copy") {
          io::write_safetensors(mesh, file, args.at(2), {io::replace("w", w)});
        } else {
          std::vector<index_t> ids;
          for (index_t r = 0; r < w.rows(); r += 2) ids.push_back(r);
          io::write_rows_in_place(mesh, file, {io::replace_rows("w", w, ids)},
                                  args.at(1) + ".undo");
        }
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kill_target: %s\n", e.what());
      status = 1;
    }
  }
  MPI_Finalize();
  return status;
}
