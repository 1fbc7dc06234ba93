// The optimizer state in a checkpoint, saved by any number of ranks and read back by
// any other number:
//   one process:  optimizer.safetensors, each tensor in its parameter's shape;
//   N ranks:      optimizer-RRRRR-of-NNNNN.safetensors, one per rank, each tensor the
//                 rank's 1-D piece of the flattened parameter, as the saving run's mesh
//                 placed it (distributed/piece_layout.hpp: with expert parallelism a
//                 routed expert's pieces are on some ranks only, the others' are empty).
// Tensors are named master.<param>, m1.<param>, m2.<param>. Reading takes, for every
// tensor, the elements this process holds out of whichever files have them; every
// file must hold exactly the tensors of this run's model and optimizer.
//
// Used by checkpoint/tensors.hpp only.
#pragma once

#include "base/run_error.hpp"
#include "base/safetensors.hpp"
#include "distributed/shard_layout.hpp"
#include "offload/shared/param_state.hpp"

#include <torch/torch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace primecfg::train {

inline std::string optimizer_file_name(int rank, int world) {
  return world == 1 ? std::string("optimizer.safetensors")
                    : fmt::format("optimizer-{:05}-of-{:05}.safetensors", rank, world);
}

// The optimizer tensors of one ParamState, by checkpoint name.
inline std::vector<std::pair<std::string, Tensor>> optimizer_tensors(ParamState& s) {
  std::vector<std::pair<std::string, Tensor>> out{{"master." + s.p->name, s.master}};
  if (s.m1.defined()) out.emplace_back("m1." + s.p->name, s.m1);
  if (s.m2.defined()) out.emplace_back("m2." + s.p->name, s.m2);
  return out;
}

inline torch::ScalarType torch_dtype(const safetensors::file& f, const safetensors::tensor_info& t) {
  if (t.type != safetensors::dtype::F32)
    throw run_error(fmt::format("{}: tensor {} has dtype {}; optimizer state is FP32", f.path().string(),
                                t.name, safetensors::dtype_name(t.type)));
  return torch::kFloat32;
}

// The piece of states[i]'s parameter that saving rank r wrote (several ranks saved).
using SavedPiece = std::function<ShardSpan(std::size_t i, int r)>;

// Reads the optimizer state that `saved_world` ranks wrote into `dir` into `states`
// (all of each tensor, or this rank's piece of it).
inline void read_optimizer_state(const std::filesystem::path& dir, int saved_world,
                                 std::vector<ParamState>& states, std::string_view optimizer,
                                 const SavedPiece& saved_piece) {
  std::vector<safetensors::file> files;
  for (int r = 0; r < saved_world; ++r) {
    files.push_back(safetensors::file::open(dir / optimizer_file_name(r, saved_world)));
    const auto& md = files.back().metadata();
    auto it = md.find("optimizer");
    if (it == md.end() || it->second != optimizer)
      throw run_error(fmt::format(
          "{}: optimizer state is {}, the config asks for {} (set ckpt.skip_optimizer to load weights only)",
          files.back().path().string(), it == md.end() ? "unnamed" : it->second, optimizer));
  }
  // Every file holds exactly this run's tensors, each in the shape its writer had.
  std::set<std::string> names;
  for (std::size_t i = 0; i < states.size(); ++i)
    for (auto& [name, t] : optimizer_tensors(states[i])) {
      names.insert(name);
      const ParamState& s = states[i];
      for (std::size_t r = 0; r < files.size(); ++r) {
        const safetensors::file& f = files[r];
        const auto* info = f.find(name);
        if (!info)
          throw run_error(fmt::format("{}: tensor {} missing (checkpoint of another model or optimizer?)",
                                      f.path().string(), name));
        torch_dtype(f, *info);
        std::vector<std::int64_t> want(s.p->tensor.sizes().begin(), s.p->tensor.sizes().end());
        if (saved_world > 1) want = {saved_piece(i, static_cast<int>(r)).per_rank};
        if (info->shape != want)
          throw run_error(fmt::format("{}: tensor {} has shape [{}], this model needs [{}] ({} rank{})",
                                      f.path().string(), name, fmt::join(info->shape, ", "),
                                      fmt::join(want, ", "), saved_world, saved_world > 1 ? "s" : ""));
      }
    }
  for (auto& f : files)
    for (const auto& t : f.tensors())
      if (!names.count(t.name))
        throw run_error(fmt::format("{}: tensor {} is not part of this run's model or optimizer",
                                    f.path().string(), t.name));

  torch::NoGradGuard ng;
  for (std::size_t i = 0; i < states.size(); ++i) {
    ParamState& s = states[i];
    const std::int64_t numel = s.p->tensor.numel();
    // The elements [first, first + count) of the flattened parameter are this process's.
    const std::int64_t first = s.shard ? s.shard->offset : 0;
    const std::int64_t count = s.shard ? s.shard->length : numel;
    for (auto& [name, dst] : optimizer_tensors(s)) {
      Tensor flat_dst = dst.view({-1});
      if (s.shard) flat_dst.zero_();  // the padding
      // Each saved piece's elements that are also this process's; the saved pieces of a
      // parameter cover it once, whatever mesh placed them.
      std::int64_t copied = 0;
      for (int r = 0; r < saved_world; ++r) {
        const ShardSpan saved = saved_world == 1 ? ShardSpan::of(numel, 0, 1) : saved_piece(i, r);
        const std::int64_t from = std::max(first, saved.offset);
        const std::int64_t to = std::min(first + count, saved.offset + saved.length);
        if (to <= from) continue;
        const safetensors::file& f = files[static_cast<std::size_t>(r)];
        const auto* info = f.find(name);
        Tensor src = torch::from_blob(const_cast<std::byte*>(info->data), {info->numel()}, torch::kFloat32)
                         .narrow(0, from - saved.offset, to - from);
        if (!torch::isfinite(src).all().item<bool>())
          throw run_error(fmt::format("{}: tensor {} holds NaN or infinite values", f.path().string(), name));
        flat_dst.narrow(0, from - first, to - from).copy_(src);
        copied += to - from;
      }
      if (copied != count)
        throw run_error(
            fmt::format("{}: the {} optimizer files hold {} of the {} elements of {} this rank "
                        "needs (their ranks' pieces do not cover the parameter)",
                        dir.string(), saved_world, copied, count, name));
    }
  }
}

}  // namespace primecfg::train
