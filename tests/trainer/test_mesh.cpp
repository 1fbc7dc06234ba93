// The device mesh (distributed/mesh.hpp): prime-rl's degrees and rules
// (parallel_dims.py, resolve_ep), read there and restated as examples here.
#include "distributed/mesh.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace primecfg::train;

namespace {

MeshRequest request(int world, long long dp_replicate, long long cp, std::optional<long long> ep,
                    std::optional<long long> experts = 64) {
  MeshRequest r;
  r.world = world;
  r.dp_replicate = dp_replicate;
  r.cp = cp;
  r.ep = ep;
  r.experts = experts;
  r.model = "the test's model";
  return r;
}

std::string problems(const MeshRequest& r) {
  std::vector<MeshProblem> ps;
  resolve_mesh(r, ps);
  std::string s;
  for (const auto& p : ps) s += p.field + ": " + p.message + "\n";
  return s;
}

}  // namespace

TEST_CASE("mesh: prime-rl's degrees") {
  // dp_shard takes what dp_replicate and cp leave.
  CHECK(resolve_mesh(request(8, 2, 1, 1)) == MeshDims{2, 4, 1, 1});
  CHECK(resolve_mesh(request(8, 1, 2, 1)) == MeshDims{1, 4, 2, 1});
  // 16 GPUs with ep 8: dp_shard (16) = dp_shard_mod_ep 2 x dp_shard_in_ep 8.
  const MeshDims m = resolve_mesh(request(16, 1, 1, 8));
  CHECK(m.dp_shard == 16);
  CHECK(m.dp_shard_in_ep() == 8);
  CHECK(m.dp_shard_mod_ep() == 2);
  // ep borrows all of cp and some of dp_shard: cp 2, ep 4 on 8 ranks.
  const MeshDims c = resolve_mesh(request(8, 1, 2, 4));
  CHECK(c.dp_shard_in_ep() == 2);
  CHECK(c.dp_shard_mod_ep() == 2);
}

TEST_CASE("mesh: ep = \"auto\" as prime-rl resolves it") {
  // min(world / dp_replicate, 8) for a model with experts under the custom implementation.
  CHECK(resolve_mesh(request(16, 1, 1, std::nullopt)).ep == 8);
  CHECK(resolve_mesh(request(16, 4, 1, std::nullopt)).ep == 4);
  CHECK(resolve_mesh(request(4, 1, 1, std::nullopt)).ep == 4);
  // 1 for a dense model, or under transformers' implementation.
  CHECK(resolve_mesh(request(16, 1, 1, std::nullopt, 0)).ep == 1);
  CHECK(resolve_mesh(request(16, 1, 1, std::nullopt, std::nullopt)).ep == 1);  // a model not known
  MeshRequest hf = request(16, 1, 1, std::nullopt);
  hf.custom_impl = false;
  CHECK(resolve_mesh(hf).ep == 1);
  // Auto does not look at the rules it must then pass: 12 ranks give 8, which does not
  // divide 12 (as in prime-rl, an error).
  const std::string p = problems(request(12, 1, 1, std::nullopt));
  CHECK(p.find("model.ep: ep = \"auto\" (resolved to 8) does not divide dp_shard x cp = 12") !=
        std::string::npos);
}

TEST_CASE("mesh: each broken rule names its field") {
  CHECK(problems(request(3, 2, 1, 1))
            .find("model.dp_replicate: dp_replicate = 2 does not divide the world size 3") !=
        std::string::npos);
  CHECK(problems(request(1, 2, 1, 1)).find("the world size 1 (one process, no launcher)") !=
        std::string::npos);
  CHECK(problems(request(8, 2, 3, 1)).find("model.cp: cp = 3 does not divide the 4 ranks") !=
        std::string::npos);
  CHECK(problems(request(8, 1, 2, 3)).find("model.ep: ep = 3 is not a multiple of cp = 2") !=
        std::string::npos);
  CHECK(problems(request(8, 2, 1, 8)).find("model.ep: ep = 8 does not divide dp_shard x cp = 4 x 1 = 4") !=
        std::string::npos);
  CHECK(problems(request(8, 1, 1, 0)).find("model.ep: ep = 0 must be >= 1") != std::string::npos);
  CHECK(problems(request(8, 2, 1, 4)).empty());
  CHECK_THROWS_AS(resolve_mesh(request(3, 2, 1, 1)), mesh_error);
}

TEST_CASE("mesh: groups, as prime-rl's row-major (dp_replicate, dp_shard_mod_ep, dp_shard_in_ep, cp)") {
  // 16 ranks: 2 replicas, cp 2, ep 4 -> dp_shard 4 = mod_ep 2 x in_ep 2.
  const MeshDims m = resolve_mesh(request(16, 2, 2, 4));
  CHECK(mesh_coords(m, 13).replica == 1);
  CHECK(mesh_coords(m, 13).mod_ep == 1);
  CHECK(mesh_coords(m, 13).in_ep == 0);
  CHECK(mesh_coords(m, 13).cp == 1);
  for (int r = 0; r < 16; ++r) CHECK(mesh_rank(m, mesh_coords(m, r)) == r);
  CHECK(mesh_group(m, MeshDim::world, 5).size() == 16);
  CHECK(mesh_group(m, MeshDim::replicate, 5) == std::vector<int>{5, 13});
  CHECK(mesh_group(m, MeshDim::fsdp, 13) == std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15});
  CHECK(mesh_group(m, MeshDim::cp, 13) == std::vector<int>{12, 13});
  // An expert-parallel group: ep consecutive ranks, whole cp groups, inside one replica.
  CHECK(mesh_group(m, MeshDim::ep, 13) == std::vector<int>{12, 13, 14, 15});
  // The experts of one expert-parallel rank are sharded over ranks ep apart.
  CHECK(mesh_group(m, MeshDim::expert_fsdp, 13) == std::vector<int>{9, 13});
  CHECK(mesh_index(m, MeshDim::ep, 13) == 1);
  CHECK(mesh_group_count(m, MeshDim::ep) == 4);
  // Every dimension's groups split the world: each rank in exactly one.
  for (MeshDim d : kMeshDims) {
    std::vector<int> seen(16, 0);
    for (int r = 0; r < 16; ++r)
      if (mesh_group(m, d, r).front() == r)
        for (int member : mesh_group(m, d, r)) ++seen[member];
    for (int s : seen) CHECK(s == 1);
    for (int r = 0; r < 16; ++r)
      for (int member : mesh_group(m, d, r)) CHECK(mesh_group_id(m, d, member) == mesh_group_id(m, d, r));
  }
}

TEST_CASE("mesh: ep > 1 divides the model's routed experts, which it must have") {
  CHECK(
      problems(request(8, 1, 1, 4, 6)) ==
      "model.ep: ep = 4 does not divide the 6 routed experts of the test's model: each expert-parallel rank "
      "runs as many\n");
  CHECK(problems(request(8, 1, 1, std::nullopt, 12))
            .find("ep = \"auto\" (resolved to 8) does not divide the 12 "
                  "routed experts") != std::string::npos);
  CHECK(problems(request(8, 1, 1, 2, 0)) ==
        "model.ep: ep = 2, and the test's model has no routed experts to split over the ranks; set ep = 1\n");
  // A model not known (its name does not resolve) is not checked against.
  CHECK(problems(request(8, 1, 1, 4, std::nullopt)).empty());
  CHECK(problems(request(8, 1, 1, 4, 8)).empty());
}
