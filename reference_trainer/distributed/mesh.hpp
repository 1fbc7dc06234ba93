// The device mesh: how the ranks of a run are laid out along prime-rl's parallel
// dimensions, decided once from the config and the world size. Every parallelism is a
// placement on it (which dimensions split a parameter, which replicate it), and every
// dimension has its own group of ranks (ProcessGroup::Dim).
//
//   world = dp_replicate x dp_shard x cp                       (prime-rl's ParallelDims)
//   rank  = ((replica x dp_shard_mod_ep + mod) x dp_shard_in_ep + in) x cp + c
//
// cp is the innermost dimension, then the part of dp_shard that expert parallelism
// borrows (dp_shard_in_ep = ep / cp), then the rest of dp_shard (dp_shard_mod_ep);
// dp_replicate is the outermost. So an expert-parallel group is `ep` consecutive ranks
// holding whole context-parallel groups, and it never crosses a replica. Without
// expert parallelism (ep = 1) dp_shard_in_ep is 1 and this is HSDP's (dp_replicate,
// dp_shard) of consecutive ranks, as before.
//
// Dense weights are sharded over dp_shard x cp (FSDP) and replicated over
// dp_replicate; experts are split over ep and sharded over dp_shard_mod_ep.
//
// Internal to primecfg-train; no LibTorch.
#pragma once

#include <primecfg/model.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace primecfg::train {

// The degrees of the parallel dimensions, resolved (no "auto", no -1).
struct MeshDims {
  int dp_replicate = 1;
  int dp_shard = 1;
  int cp = 1;
  int ep = 1;

  int world() const { return dp_replicate * dp_shard * cp; }
  // The ranks that split the dense weights (FSDP): dp_shard x cp.
  int fsdp() const { return dp_shard * cp; }
  // dp_shard's share of an expert-parallel group, and what is left of dp_shard beside it.
  int dp_shard_in_ep() const { return ep / cp; }
  int dp_shard_mod_ep() const { return dp_shard * cp / ep; }
  bool operator==(const MeshDims&) const = default;
};

// The mesh's dimensions, each a way of grouping the ranks; a rank's group along one
// holds the ranks whose coordinates differ only there.
enum class MeshDim {
  world,        // every rank: the loss, the gradient norm
  replicate,    // dp_replicate: the ranks holding the same pieces (HSDP's replicas)
  fsdp,         // dp_shard x cp: the ranks that split the dense weights
  cp,           // cp: the ranks that split one sequence
  ep,           // dp_shard_in_ep x cp: the ranks that split the experts (the all-to-all)
  expert_fsdp,  // dp_shard_mod_ep: the ranks that split one expert-parallel rank's experts
};
inline constexpr MeshDim kMeshDims[] = {MeshDim::world, MeshDim::replicate, MeshDim::fsdp,
                                        MeshDim::cp,    MeshDim::ep,        MeshDim::expert_fsdp};
std::string_view mesh_dim_name(MeshDim d);

// What the config says, before resolution. `ep` is nullopt for "auto".
struct MeshRequest {
  int world = 1;
  long long dp_replicate = 1;       // model.dp_replicate
  long long cp = 1;                 // model.cp
  std::optional<long long> ep = 1;  // model.ep; nullopt: "auto"
  // The model's routed experts a block (0: a dense model): what prime-rl's "auto" looks
  // at, and what ep > 1 must divide; nullopt where the model is not known (a config check
  // whose model.name does not resolve: "auto" is then 1, and ep is not checked against it).
  std::optional<long long> experts;
  std::string model;  // model.name, for the messages
  // Whether the implementation is the custom one ("custom" or "auto"; "auto" resolves to 1 else).
  bool custom_impl = true;

  // What a config's [model] asks for on `world` ranks, for a model of `experts`.
  static MeshRequest of(const ModelConfig& m, int world, std::optional<long long> experts);
};

// A rule of prime-rl's mesh that the request breaks: the field to change and why.
struct MeshProblem {
  std::string field;  // "model.dp_replicate", "model.cp", "model.ep"
  std::string message;
};

// prime-rl's resolution (parallel_dims.py: resolve_ep, then ParallelDims): ep = "auto"
// is min(world / dp_replicate, 8) for a model with experts and the custom
// implementation, 1 otherwise; dp_shard = world / (dp_replicate x cp); then
// dp_replicate x dp_shard x cp = world, and with ep > 1: ep % cp = 0,
// (dp_shard x cp) % ep = 0, and ep divides the model's routed experts (none: an error).
// `problems` gets every rule broken (empty: the mesh is valid).
MeshDims resolve_mesh(const MeshRequest& r, std::vector<MeshProblem>& problems);
// The same, throwing mesh_error with every problem when there is one.
struct mesh_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
MeshDims resolve_mesh(const MeshRequest& r);

// A rank's coordinates on the mesh.
struct MeshCoords {
  int replica = 0;  // along dp_replicate
  int mod_ep = 0;   // along dp_shard_mod_ep
  int in_ep = 0;    // along dp_shard_in_ep
  int cp = 0;       // along cp
};
MeshCoords mesh_coords(const MeshDims& m, int rank);
int mesh_rank(const MeshDims& m, const MeshCoords& c);

// The ranks of `rank`'s group along `d`, in the order of their place in it; `rank` is
// at index mesh_index(m, d, rank).
std::vector<int> mesh_group(const MeshDims& m, MeshDim d, int rank);
int mesh_index(const MeshDims& m, MeshDim d, int rank);
// The number of such groups, and which one `rank` is in (0 .. groups - 1): the same
// for every member, different between groups.
int mesh_group_count(const MeshDims& m, MeshDim d);
int mesh_group_id(const MeshDims& m, MeshDim d, int rank);

}  // namespace primecfg::train
