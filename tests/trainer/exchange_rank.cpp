// One rank of exchange_test.py: builds the device mesh of a world the launcher started
// (Gloo, CPU), and writes what its collectives gave for the test to check against its
// own layout of prime-rl's mesh and against torch.distributed:
//
//   group.<dim>          which ranks a sum over the dimension's group reached (a sum of
//                        one-hot vectors, through the group's own backend)
//   <dim>.x / .send      rows this rank sends, and how many to each member
//   <dim>.recv           what exchange_counts said each member sends here
//   <dim>.y              exchange_rows(x): the rows received
//   <dim>.g / .dx        a gradient for y, and the gradient that came back for x
//
// usage: exchange_rank OUT_DIR DP_REPLICATE EP
#include "base/safetensors.hpp"
#include "distributed/group_exchange.hpp"
#include "distributed/launch.hpp"
#include "distributed/mesh.hpp"
#include "distributed/process_group.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

using namespace primecfg::train;

namespace {

struct Out {
  std::vector<torch::Tensor> keep;  // the data of the entries
  std::vector<safetensors::entry> entries;
  void add(const std::string& name, torch::Tensor t) {
    t = t.contiguous();
    keep.push_back(t);
    const auto type = t.scalar_type() == torch::kInt64 ? safetensors::dtype::I64 : safetensors::dtype::F64;
    entries.push_back({name, type, t.sizes().vec(), t.data_ptr(), static_cast<std::size_t>(t.nbytes())});
  }
};

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 4) {
    std::cerr << "usage: exchange_rank OUT_DIR DP_REPLICATE EP\n";
    return 2;
  }
  const std::filesystem::path out_dir = argv[1];
  const Launch launch = Launch::from_environment();
  MeshRequest req;
  req.world = launch.world;
  req.dp_replicate = std::atoll(argv[2]);
  req.ep = std::atoll(argv[3]);
  const MeshDims mesh = resolve_mesh(req);
  ProcessGroup pg(launch, mesh, torch::kCPU, std::chrono::seconds(60));
  const int rank = launch.rank, world = launch.world;
  Out out;
  for (MeshDim d : kMeshDims) {
    const std::string name(mesh_dim_name(d));
    torch::Tensor hit = torch::zeros({world}, torch::kFloat64);
    hit[rank] = 1.0;
    pg.all_reduce_sum(hit, "the test's group sum", d);
    out.add("group." + name, hit);
  }
  // Exchanges over the experts' group and over the world: a few rows of 3 values to
  // each member, some members none.
  for (MeshDim d : {MeshDim::ep, MeshDim::world}) {
    const std::string name(mesh_dim_name(d));
    GroupExchange ex(pg, d, "the test's exchange over " + name);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * rank + static_cast<int>(d));
    std::vector<std::int64_t> send;
    for (int j = 0; j < ex.ranks(); ++j)
      send.push_back(j == (rank + 1) % ex.ranks() ? 0 : torch::randint(0, 4, {1}, gen).item<std::int64_t>());
    std::int64_t total = 0;
    for (auto s : send) total += s;
    torch::Tensor x = torch::randn({total, 3}, gen, torch::kFloat64).requires_grad_(true);
    const std::vector<std::int64_t> recv = exchange_counts(ex, send, torch::kCPU);
    torch::Tensor y = exchange_rows(ex, x, send, recv);
    torch::Tensor g = torch::randn(y.sizes(), gen, torch::kFloat64);
    (y * g).sum().backward();
    out.add(name + ".x", x.detach());
    out.add(name + ".send", torch::tensor(send, torch::kInt64));
    out.add(name + ".recv", torch::tensor(recv, torch::kInt64));
    out.add(name + ".y", y.detach());
    out.add(name + ".g", g);
    out.add(name + ".dx", x.grad());
  }
  safetensors::write(out_dir / fmt::format("rank{}.safetensors", rank), out.entries,
                     {{"dp_replicate", std::to_string(mesh.dp_replicate)},
                      {"dp_shard", std::to_string(mesh.dp_shard)},
                      {"ep", std::to_string(mesh.ep)}});
  return 0;
} catch (const std::exception& e) {
  std::cerr << "exchange_rank: " << e.what() << "\n";
  return 1;
}
