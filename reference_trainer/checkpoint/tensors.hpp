// Checkpoints of the run's tensors: what save_checkpoint writes into a step folder
// and load_checkpoint reads back, checked name by name (the folder's layout, manifest,
// lock and pruning are checkpoint/dir.hpp's). Used by trainer.cpp only.
#pragma once

#include "base/remove_tree.hpp"
#include "base/run_error.hpp"
#include "base/safetensors.hpp"
#include "checkpoint/dir.hpp"
#include "checkpoint/shards.hpp"
#include "checkpoint/weight_files.hpp"
#include "distributed/piece_layout.hpp"
#include "distributed/sharding.hpp"
#include "nn/hf_weights.hpp"
#include "nn/transformer.hpp"
#include "offload/pipeline.hpp"
#include "optim/math.hpp"

#include <primecfg/checkpoint.hpp>

#include <torch/torch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace primecfg::train {

using torch::Tensor;
namespace fs = std::filesystem;

inline safetensors::dtype st_dtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return safetensors::dtype::F32;
    case torch::kBFloat16:
      return safetensors::dtype::BF16;
    case torch::kFloat16:
      return safetensors::dtype::F16;
    case torch::kInt64:
      return safetensors::dtype::I64;
    case torch::kUInt8:
      return safetensors::dtype::U8;
    default:
      throw run_error("checkpoint: unsupported dtype");
  }
}

// Tensors to write, kept alive (and on the CPU, contiguous) until written.
struct TensorBundle {
  std::vector<Tensor> keep;
  std::vector<safetensors::entry> entries;
  void add(const std::string& name, const Tensor& t) {
    Tensor c = t.detach().to(torch::kCPU).contiguous();
    keep.push_back(c);
    entries.push_back({name, st_dtype(c.scalar_type()),
                       std::vector<std::int64_t>(c.sizes().begin(), c.sizes().end()), c.data_ptr(),
                       c.nbytes()});
  }
};

// A safetensors file of tensors too large to be in host memory together: tensor i is
// asked for (`get(i)`, on any device) only when it is written, copied to the host,
// written and dropped. `get` is called for every tensor, in order, even after a write
// failed, since it may be a collective that every rank must join; the first failure is
// thrown once all were asked for. With `writes` false nothing is written (a rank that
// only takes part in the gathers).
struct TensorLayout {
  std::string name;
  torch::ScalarType dtype;
  std::vector<std::int64_t> shape;
};
inline void write_one_at_a_time(const fs::path& path, const std::vector<TensorLayout>& layout,
                                const std::function<Tensor(std::size_t)>& get,
                                const std::map<std::string, std::string>& metadata, bool writes = true) {
  std::optional<safetensors::writer> out;
  std::string error;
  auto attempt = [&](const std::function<void()>& fn) {
    if (!writes || !error.empty()) return;
    try {
      fn();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  attempt([&] {
    std::vector<safetensors::entry> entries;
    for (const auto& t : layout) {
      std::int64_t numel = 1;
      for (auto n : t.shape) numel *= n;
      entries.push_back({t.name, st_dtype(t.dtype), t.shape, nullptr,
                         static_cast<std::size_t>(numel) * c10::elementSize(t.dtype)});
    }
    out.emplace(path, entries, metadata);
  });
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const Tensor t = get(i);
    attempt([&] {
      const Tensor host = t.detach().to(torch::kCPU).contiguous();
      if (host.scalar_type() != layout[i].dtype)
        throw run_error(fmt::format("{}: tensor {} is {}, its layout says {}", path.string(), layout[i].name,
                                    c10::toString(host.scalar_type()), c10::toString(layout[i].dtype)));
      out->put(layout[i].name, host.data_ptr(), host.nbytes());
    });
  }
  attempt([&] { out->finish(); });
  if (!error.empty()) throw run_error(error);
}

// A whole file, or an error naming it (a full disk must not pass as a checkpoint);
// a failed write leaves the previous file as it was (replace_file).
inline void write_file(const fs::path& path, std::string_view text) {
  try {
    replace_file(path, std::string(text));
  } catch (const checkpoint_error& e) {
    throw run_error(e.what());
  }
}

inline std::string_view hf_dtype_name(torch::ScalarType t) {
  return t == torch::kBFloat16 ? "bfloat16" : t == torch::kFloat16 ? "float16" : "float32";
}

// The tokenizer and generation settings of the HF directory the run started from, so
// that a checkpoint is a model directory that HF and vLLM can use as it is.
inline void copy_tokenizer_files(const std::optional<fs::path>& source_dir, const fs::path& to) {
  if (!source_dir) return;
  for (const char* name :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
        "merges.txt", "generation_config.json", "chat_template.jinja", "added_tokens.json"}) {
    std::error_code ec;
    const fs::path from = *source_dir / name;
    if (!fs::is_regular_file(from, ec)) continue;
    fs::copy_file(from, to / name, fs::copy_options::overwrite_existing, ec);
    if (ec)
      throw run_error(fmt::format("{}: cannot copy into the checkpoint: {}", from.string(), ec.message()));
  }
}

// Sharded: the optimizer pieces' sums (size, xxHash64), each from the rank that wrote
// its piece, on every rank, for rank 0's manifest (a collective: every rank calls it).
inline std::map<std::string, Manifest::File> piece_sums(Sharding& dp,
                                                        const std::optional<Manifest::File>& mine,
                                                        int pieces) {
  Tensor t = torch::zeros({pieces, 2}, torch::kInt64);
  if (mine) {
    t[dp.shard_rank()][0] = static_cast<std::int64_t>(mine->bytes);
    t[dp.shard_rank()][1] = static_cast<std::int64_t>(std::stoull(mine->xxh64, nullptr, 16));
  }
  t = t.to(dp.weight_shard(0).device());
  dp.sum(t, "the checksums of the optimizer pieces");  // one row each, from replica 0
  t = t.cpu();
  std::map<std::string, Manifest::File> out;
  for (int r = 0; r < pieces; ++r)
    out[optimizer_file_name(r, pieces)] = {
        static_cast<std::uint64_t>(t[r][0].item<std::int64_t>()),
        fmt::format("{:016x}", static_cast<unsigned long long>(t[r][1].item<std::int64_t>()))};
  return out;
}

// Writes step pos.step into <root>/step_N (through a temporary folder and one rename).
// Sharded (`dp`): every rank of the first replica writes its piece of the optimizer
// state (with HSDP the pieces of one shard group), rank 0 the rest and then,
// once every rank has written, the manifest; a rank that fails makes all fail, and
// the temporary folder is removed.
template <offload_pipeline Pipeline>
void save_checkpoint(const fs::path& root, Transformer& model, Pipeline& state, const OptSettings& opt,
                     const TrainPosition& pos, const CheckpointConfig& cfg,
                     const std::optional<fs::path>& source_dir, Sharding* dp,
                     std::uint64_t max_shard_bytes = hf_max_shard_bytes) {
  state.sync_host();
  const int rank = dp ? dp->rank() : 0;
  // The optimizer state is written in pieces, one file per piece, by the ranks of the
  // first replica (HSDP's other replicas hold the same pieces).
  const int piece = dp ? dp->shard_rank() : 0, pieces = dp ? dp->shard_world() : 1;
  const bool writes_pieces = !dp || dp->replica() == 0;
  // How the pieces were placed (distributed/piece_layout.hpp): the shard group's ranks
  // and the expert-parallel degree say it.
  const int ep = dp ? dp->group().mesh().ep : 1;
  const fs::path tmp = root / fmt::format(".step_{}.tmp", pos.step);
  auto on_rank0 = [&](std::string_view what, const std::function<void()>& fn) {
    if (!dp) return fn();
    dp->group().on_rank0(what, [&] {
      fn();
      return std::string();
    });
  };
  auto remove_tmp = [&] {
    std::error_code ec;
    if (rank == 0) remove_tree(tmp, ec);  // a full disk must not leave half a checkpoint behind
  };
  on_rank0("creating the checkpoint folder", [&] {
    fs::create_directories(root);
    remove_tree(tmp);
    fs::create_directories(tmp);
  });
  std::string error;
  std::optional<Manifest::File> piece_sum;  // sharded: this rank's piece, summed by this rank
  try {
    // The weights (model.safetensors, or files of at most max_shard_bytes and their
    // index, as transformers splits them) and config.json, by rank 0: the folder is
    // also an HF model directory. Sharded, each weight is gathered whole on its own
    // and freed once written: never the whole model on a rank (Llama-3.1-70B's is
    // 131 GiB).
    const auto& params = model.params();
    std::vector<std::string> names;
    for (const auto& p : params) names.push_back(p.name);
    const std::vector<std::size_t> order = hf_state_dict_order(names);
    std::vector<std::uint64_t> bytes;
    for (std::size_t i : order) bytes.push_back(params[i].tensor.numel() * params[i].tensor.element_size());
    const WeightFiles split = split_weight_files(bytes, max_shard_bytes);
    for (const auto& file : split.files) {
      std::vector<TensorLayout> layout;
      for (std::size_t k : file.tensors) {
        const Tensor& t = params[order[k]].tensor;
        layout.push_back({names[order[k]], t.scalar_type(), {t.sizes().begin(), t.sizes().end()}});
      }
      write_one_at_a_time(
          tmp / file.name, layout,
          [&](std::size_t j) {
            const std::size_t i = order[file.tensors[j]];
            return dp ? dp->whole_weight(i) : params[i].tensor;
          },
          {{"format", "pt"}}, rank == 0);
    }
    if (rank == 0) {
      if (split.indexed()) {
        std::vector<std::string> ordered_names;
        for (std::size_t i : order) ordered_names.push_back(names[i]);
        write_file(tmp / "model.safetensors.index.json", weight_index_json(split, ordered_names));
      }
      write_file(tmp / "config.json", hf_config_json(model.args(), hf_dtype_name(model.dtype())));
      copy_tokenizer_files(source_dir, tmp);
    }
    if (!cfg.skip_optimizer && writes_pieces) {
      // One piece: no padding, the parameter's shape.
      std::vector<TensorLayout> layout;
      std::vector<Tensor> tensors;
      for (auto& s : state.states())
        for (auto& [name, t] : optimizer_tensors(s)) {
          tensors.push_back(pieces == 1 ? t.view(s.p->tensor.sizes()) : t);
          layout.push_back(
              {name, t.scalar_type(), {tensors.back().sizes().begin(), tensors.back().sizes().end()}});
        }
      const fs::path file = tmp / optimizer_file_name(piece, pieces);
      write_one_at_a_time(file, layout, [&](std::size_t i) { return tensors[i]; },
                          {{"optimizer", std::string(opt.name())},
                           {"rank", std::to_string(piece)},
                           {"world_size", std::to_string(pieces)},
                           {"ep", std::to_string(ep)}});
      if (dp) piece_sum = sum_file(file);
    }
    if (rank == 0) {
      TensorBundle b;
      b.add("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
      safetensors::write(tmp / "trainer_state.safetensors", b.entries,
                         {{"step", std::to_string(pos.step)},
                          {"data_position", std::to_string(pos.data_position)},
                          {"scheduler_step", std::to_string(pos.scheduler_step)},
                          {"offload", std::string(Pipeline::strategy::name)},
                          {"optimizer", std::string(opt.name())},
                          {"world_size", std::to_string(pieces)},
                          {"ep", std::to_string(ep)}});
    }
  } catch (const std::exception& e) {
    if (!dp) {
      remove_tmp();
      throw;
    }
    error = e.what();
  }
  try {
    if (dp) dp->group().agree(fmt::format("writing checkpoint step {}", pos.step), error);
    std::map<std::string, Manifest::File> known;
    if (dp && !cfg.skip_optimizer) known = piece_sums(*dp, piece_sum, pieces);
    // Last: the manifest, which makes the folder a checkpoint; then one rename.
    on_rank0("publishing the checkpoint", [&] {
      write_manifest(tmp, pos.step, !cfg.skip_optimizer, known);
      publish_checkpoint(tmp, step_dir(root, pos.step));
      if (cfg.keep_last) prune_checkpoints(root, *cfg.keep_last, pos.step);
    });
  } catch (...) {
    remove_tmp();
    throw;
  }
}

// Copies a checkpoint tensor into dst, checking name, shape and dtype (a checkpoint
// of another model fails here with the tensor's name); marks it consumed.
inline void load_into(const safetensors::file& f, const std::string& name, Tensor dst,
                      std::set<std::string>& consumed) {
  const auto* t = f.find(name);
  if (!t)
    throw run_error(fmt::format("{}: tensor {} missing (checkpoint of another model or optimizer?)",
                                f.path().string(), name));
  std::vector<std::int64_t> want(dst.sizes().begin(), dst.sizes().end());
  if (t->shape != want)
    throw run_error(fmt::format("{}: tensor {} has shape [{}], this model needs [{}]", f.path().string(),
                                name, fmt::join(t->shape, ", "), fmt::join(want, ", ")));
  torch::ScalarType st;
  switch (t->type) {
    case safetensors::dtype::BF16:
      st = torch::kBFloat16;
      break;
    case safetensors::dtype::F32:
      st = torch::kFloat32;
      break;
    case safetensors::dtype::F16:
      st = torch::kFloat16;
      break;
    default:
      throw run_error(fmt::format("{}: tensor {} has dtype {}; a checkpoint holds F32, BF16 or F16 here",
                                  f.path().string(), name, safetensors::dtype_name(t->type)));
  }
  if (dst.scalar_type() == torch::kFloat32 && st != torch::kFloat32 && name.rfind("model.", 0) != 0 &&
      name != kLmHeadParam)
    throw run_error(fmt::format("{}: tensor {} has dtype {}; optimizer state is FP32", f.path().string(),
                                name, safetensors::dtype_name(t->type)));
  torch::NoGradGuard ng;
  Tensor src = torch::from_blob(const_cast<std::byte*>(t->data), t->shape, torch::TensorOptions().dtype(st));
  if (!torch::isfinite(src).all().item<bool>())
    throw run_error(fmt::format("{}: tensor {} holds NaN or infinite values", f.path().string(), name));
  dst.detach().copy_(src);
  consumed.insert(name);
}

// Every tensor of a checkpoint file was loaded, or the checkpoint is not this run's.
inline void all_consumed(const safetensors::file& f, const std::set<std::string>& consumed) {
  for (const auto& t : f.tensors())
    if (!consumed.count(t.name))
      throw run_error(fmt::format("{}: tensor {} is not part of this run's model or optimizer",
                                  f.path().string(), t.name));
}

// A positive integer of trainer_state.safetensors' metadata (1 when absent: a
// checkpoint from before the key existed): world_size, how many ranks wrote the
// optimizer pieces; ep, the expert-parallel degree that placed them.
inline int saved_count(const fs::path& dir, const std::string& key) {
  auto sf = safetensors::file::open(dir / "trainer_state.safetensors");
  auto it = sf.metadata().find(key);
  if (it == sf.metadata().end()) return 1;
  int n = 0;
  try {
    n = std::stoi(it->second);
  } catch (const std::exception&) {
  }
  if (n < 1 || std::to_string(n) != it->second)
    throw run_error(
        fmt::format("{}: {} = \"{}\" is not a positive integer", sf.path().string(), key, it->second));
  return n;
}

// The mesh that placed a checkpoint's optimizer pieces (its first replica): `world` ranks
// splitting the dense weights, `ep` of them the experts; an error names what cannot be.
inline MeshDims saved_mesh(const fs::path& dir, const ModelArgs& args) {
  MeshDims m;
  m.dp_shard = saved_count(dir, "world_size");
  m.ep = saved_count(dir, "ep");
  const std::int64_t experts = args.moe ? args.moe->experts : 0;
  if (m.ep > 1 && (m.dp_shard % m.ep != 0 || experts % m.ep != 0))
    throw run_error(
        fmt::format("{}: ep = {} with world_size = {} and a model of {} routed experts: not a "
                    "layout a run can have saved",
                    (dir / "trainer_state.safetensors").string(), m.ep, m.dp_shard, experts));
  return m;
}

template <offload_pipeline Pipeline>
TrainPosition load_checkpoint(const fs::path& dir, std::int64_t step, Transformer& model, Pipeline& state,
                              const OptSettings& opt, const CheckpointConfig& cfg, Sharding* dp) {
  if (!fs::is_directory(dir)) throw run_error(dir.string() + ": no such checkpoint");
  try {
    // Every file is read back once, by one rank (files taken in turn), and every rank
    // fails if one finds a file changed.
    Manifest manifest;
    std::string bad;
    try {
      manifest = verify_checkpoint(dir, step, dp ? dp->rank() : 0, dp ? dp->world() : 1);
    } catch (const checkpoint_error& e) {
      if (!dp) throw;
      bad = e.what();
    }
    if (dp) dp->group().agree(fmt::format("verifying checkpoint step {}", step), bad);
    // The model must be the run's: config.json describes the same computation (not
    // only the same parameter shapes: another rope_theta or rms_norm_eps loads fine
    // and trains a different function).
    const ModelArgs saved = read_hf_config(dir / "config.json");
    if (const auto diffs = computation_differences(saved, "the checkpoint", model.args(), "this run's model");
        !diffs.empty())
      throw run_error(
          fmt::format("{}: the checkpoint's model is not this run's ({}); resume it with the model it "
                      "was saved with",
                      (dir / "config.json").string(), fmt::join(diffs, "; ")));
    // The weights: model.safetensors, or the files its index names.
    WeightFileSet weights;
    try {
      weights = open_weight_files(dir);
    } catch (const safetensors::error&) {
      throw;
    } catch (const std::runtime_error& e) {
      throw run_error(e.what());  // the index: malformed, not the files' own, a tensor twice
    }
    auto file_with = [&](const std::string& name) -> const safetensors::file& {
      auto it = weights.tensors.find(name);
      return it == weights.tensors.end() ? weights.files.front() : *it->second.file;  // that names it missing
    };
    std::set<std::string> consumed;
    for (std::size_t i = 0; i < model.params().size(); ++i) {
      NamedParam& p = model.params()[i];
      if (!dp) {
        load_into(file_with(p.name), p.name, p.tensor, consumed);
        continue;
      }
      // Sharded: one whole weight at a time, of which this rank keeps its piece.
      NamedParam whole{p.name, torch::empty(p.tensor.sizes(), p.tensor.options().requires_grad(false)),
                       p.block};
      load_into(file_with(p.name), p.name, whole.tensor, consumed);
      dp->adopt(i, whole);
    }
    for (const auto& f : weights.files) all_consumed(f, consumed);
    if (!cfg.skip_optimizer) {
      if (!manifest.optimizer)
        throw run_error(fmt::format(
            "{}: has no optimizer state (saved with ckpt.skip_optimizer); set ckpt.skip_optimizer = true to "
            "resume from its weights with fresh optimizer moments",
            dir.string()));
      const MeshDims saved = saved_mesh(dir, model.args());
      const std::vector<ParamShape> shapes = model.args().params();
      const std::int64_t experts = model.args().moe ? model.args().moe->experts : 0;
      read_optimizer_state(dir, saved.world(), state.states(), opt.name(), [&](std::size_t i, int r) {
        return piece_of(saved, r, shapes[i].numel(), shapes[i].expert, experts);
      });
    } else {
      state.masters_from_model();  // asked for: masters are the weights, moments start at zero
    }
    auto sf = safetensors::file::open(dir / "trainer_state.safetensors");
    TrainPosition pos = parse_trainer_state(sf.metadata(), sf.path().string(), step);
    if (cfg.skip_scheduler) pos.scheduler_step = 0;
    if (const auto* rng = sf.find("rng.cpu")) {
      auto t = torch::empty({static_cast<std::int64_t>(rng->nbytes)}, torch::kUInt8);
      std::memcpy(t.data_ptr(), rng->data, rng->nbytes);
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(t);
    }
    return pos;
  } catch (const safetensors::error& e) {
    throw run_error(e.what());
  } catch (const checkpoint_error& e) {
    throw run_error(e.what());
  } catch (const model_config_error& e) {
    throw run_error(e.what());
  }
}

}  // namespace primecfg::train
