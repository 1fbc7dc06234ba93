#include "distributed/mesh.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace primecfg::train {

std::string_view mesh_dim_name(MeshDim d) {
  switch (d) {
    case MeshDim::world:
      return "world";
    case MeshDim::replicate:
      return "dp_replicate";
    case MeshDim::fsdp:
      return "dp_shard_cp";
    case MeshDim::cp:
      return "cp";
    case MeshDim::ep:
      return "ep";
    case MeshDim::expert_fsdp:
      break;
  }
  return "dp_shard_mod_ep";
}

MeshRequest MeshRequest::of(const ModelConfig& m, int world, std::optional<long long> experts) {
  MeshRequest r;
  r.world = world;
  r.dp_replicate = m.dp_replicate;
  r.cp = m.cp;
  r.ep = m.ep.is_number() ? std::optional<long long>(m.ep.number()) : std::nullopt;
  r.experts = experts;
  r.model = m.name;
  r.custom_impl = m.impl == ModelImpl::custom || m.impl == ModelImpl::auto_;
  return r;
}

MeshDims resolve_mesh(const MeshRequest& r, std::vector<MeshProblem>& problems) {
  const auto count = problems.size();
  auto problem = [&](std::string field, std::string message) {
    problems.push_back({std::move(field), std::move(message)});
  };
  const std::string world_is =
      fmt::format("the world size {}{}", r.world, r.world == 1 ? " (one process, no launcher)" : "");
  MeshDims m;
  // Bounds first: the rules below divide by these.
  if (r.dp_replicate < 1)
    problem("model.dp_replicate", fmt::format("dp_replicate = {} must be >= 1", r.dp_replicate));
  if (r.cp < 1) problem("model.cp", fmt::format("cp = {} must be >= 1", r.cp));
  if (r.ep && *r.ep < 1) problem("model.ep", fmt::format("ep = {} must be >= 1", *r.ep));
  if (problems.size() != count) return m;
  m.dp_replicate = static_cast<int>(r.dp_replicate);
  m.cp = static_cast<int>(r.cp);
  // ep = "auto" (resolve_ep): every rank of a replica, at most a node of 8, for a model
  // with experts under the custom implementation; 1 otherwise. cp is not consulted.
  if (r.ep)
    m.ep = static_cast<int>(*r.ep);
  else
    m.ep =
        r.experts.value_or(0) > 0 && r.custom_impl ? std::max(1, std::min(r.world / m.dp_replicate, 8)) : 1;
  const std::string ep_is =
      r.ep ? fmt::format("ep = {}", m.ep) : fmt::format("ep = \"auto\" (resolved to {})", m.ep);
  // The experts' rules do not depend on the ranks' layout: said whatever else is wrong.
  const std::string model = r.model.empty() ? "the model" : r.model;
  if (m.ep > 1 && r.experts && *r.experts == 0)
    problem("model.ep", fmt::format("{}, and {} has no routed experts to split over the ranks; set ep = 1",
                                    ep_is, model));
  else if (m.ep > 1 && r.experts && *r.experts % m.ep != 0)
    problem(
        "model.ep",
        fmt::format("{} does not divide the {} routed experts of {}: each expert-parallel rank runs as many",
                    ep_is, *r.experts, model));

  if (r.world % m.dp_replicate != 0) {
    problem("model.dp_replicate",
            fmt::format("dp_replicate = {} does not divide {}: HSDP splits the ranks into dp_replicate shard "
                        "groups of equal size",
                        m.dp_replicate, world_is));
    return m;
  }
  if ((r.world / m.dp_replicate) % m.cp != 0) {
    problem("model.cp",
            fmt::format("cp = {} does not divide the {} ranks of each replica ({}, dp_replicate = {})", m.cp,
                        r.world / m.dp_replicate, world_is, m.dp_replicate));
    return m;
  }
  m.dp_shard = r.world / (m.dp_replicate * m.cp);
  if (m.ep > 1) {
    if (m.ep % m.cp != 0)
      problem("model.ep", fmt::format("{} is not a multiple of cp = {}: an expert-parallel group holds whole "
                                      "context-parallel groups",
                                      ep_is, m.cp));
    else if (m.fsdp() % m.ep != 0)
      problem("model.ep",
              fmt::format("{} does not divide dp_shard x cp = {} x {} = {} (the ranks of one replica, {}, "
                          "dp_replicate = {}): expert parallelism splits the ranks that shard the weights",
                          ep_is, m.dp_shard, m.cp, m.fsdp(), world_is, m.dp_replicate));
  }
  return m;
}

MeshDims resolve_mesh(const MeshRequest& r) {
  std::vector<MeshProblem> problems;
  MeshDims m = resolve_mesh(r, problems);
  if (problems.empty()) return m;
  std::string msg;
  for (const auto& p : problems) msg += fmt::format("{}{}: {}", msg.empty() ? "" : "; ", p.field, p.message);
  throw mesh_error(msg);
}

MeshCoords mesh_coords(const MeshDims& m, int rank) {
  MeshCoords c;
  c.cp = rank % m.cp;
  rank /= m.cp;
  c.in_ep = rank % m.dp_shard_in_ep();
  rank /= m.dp_shard_in_ep();
  c.mod_ep = rank % m.dp_shard_mod_ep();
  c.replica = rank / m.dp_shard_mod_ep();
  return c;
}

int mesh_rank(const MeshDims& m, const MeshCoords& c) {
  return ((c.replica * m.dp_shard_mod_ep() + c.mod_ep) * m.dp_shard_in_ep() + c.in_ep) * m.cp + c.cp;
}

namespace {

// The members of rank's group along d: every rank that agrees with it on the other
// coordinates, enumerated with the group's coordinates in mesh order (outer first).
template <class Fn>
void for_each_member(const MeshDims& m, MeshDim d, int rank, Fn&& fn) {
  const MeshCoords c = mesh_coords(m, rank);
  const bool all = d == MeshDim::world;
  const bool rep = all || d == MeshDim::replicate;
  const bool mod = all || d == MeshDim::fsdp || d == MeshDim::expert_fsdp;
  const bool in = all || d == MeshDim::fsdp || d == MeshDim::ep;
  const bool cp = all || d == MeshDim::fsdp || d == MeshDim::cp || d == MeshDim::ep;
  MeshCoords x = c;
  for (x.replica = rep ? 0 : c.replica; x.replica < (rep ? m.dp_replicate : c.replica + 1); ++x.replica)
    for (x.mod_ep = mod ? 0 : c.mod_ep; x.mod_ep < (mod ? m.dp_shard_mod_ep() : c.mod_ep + 1); ++x.mod_ep)
      for (x.in_ep = in ? 0 : c.in_ep; x.in_ep < (in ? m.dp_shard_in_ep() : c.in_ep + 1); ++x.in_ep)
        for (x.cp = cp ? 0 : c.cp; x.cp < (cp ? m.cp : c.cp + 1); ++x.cp) fn(mesh_rank(m, x));
}

}  // namespace

std::vector<int> mesh_group(const MeshDims& m, MeshDim d, int rank) {
  std::vector<int> out;
  for_each_member(m, d, rank, [&](int r) { out.push_back(r); });
  return out;
}

int mesh_index(const MeshDims& m, MeshDim d, int rank) {
  const auto g = mesh_group(m, d, rank);
  return static_cast<int>(std::find(g.begin(), g.end(), rank) - g.begin());
}

int mesh_group_count(const MeshDims& m, MeshDim d) {
  return m.world() / static_cast<int>(mesh_group(m, d, 0).size());
}

int mesh_group_id(const MeshDims& m, MeshDim d, int rank) {
  // Groups are numbered by their smallest member's order among the groups' smallest members.
  const int lowest = mesh_group(m, d, rank).front();
  int id = 0;
  for (int r = 0; r < lowest; ++r)
    if (mesh_group(m, d, r).front() == r) ++id;
  return id;
}

}  // namespace primecfg::train
