#include "distributed/process_group.hpp"

#include "base/run_error.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#if defined(PRIMECFG_WITH_CUDA) && defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

namespace primecfg::train {

namespace {

std::string first_line(std::string_view s) {
  const auto nl = s.find('\n');
  return std::string(s.substr(0, nl));
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string get_str(c10d::Store& store, const std::string& key) {
  const std::vector<std::uint8_t> v = store.get(key);
  return std::string(v.begin(), v.end());
}

}  // namespace

// torchrun's agent store outlives a restart, with the keys of the attempt before, and
// the agents need not agree on the restart count (one that restarts its healthy workers
// because another node re-joined does not count it). So rank 0 names the round: a fresh
// token under a fixed key, and a counter it ticks while the others look. A rank that
// reads a token whose counter stands still has read the last round's (torchrun stops
// every worker of a round before the next starts) and reads again.
class RoundName {
 public:
  RoundName(c10d::Store& store, const Launch& launch, std::chrono::seconds timeout) {
    if (launch.rank == 0) {
      std::random_device rd;
      token = fmt::format("{:08x}{:08x}{:08x}", rd(), rd(), static_cast<std::uint32_t>(now_ms()));
      store.set(kKey, std::vector<std::uint8_t>(token.begin(), token.end()));
      ticker_ = std::thread([this, s = store.clone(), key = tick_key(token)] {
        std::unique_lock lk(mu_);
        while (!stop_) {
          try {
            s->add(key, 1);
          } catch (const std::exception&) {
            return;
          }
          cv_.wait_for(lk, std::chrono::milliseconds(50));
        }
      });
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      store.wait({kKey});
      token = get_str(store, kKey);
      const std::int64_t before = store.add(tick_key(token), 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      if (store.add(tick_key(token), 0) > before) return;
      if (std::chrono::steady_clock::now() > deadline)
        throw run_error(fmt::format(
            "rank {}: no rank 0 of this round in torchrun's store at {}:{} within {} s (only the last "
            "round's name is there)",
            launch.rank, launch.master_addr, launch.master_port, timeout.count()));
    }
  }
  // Rank 0 ticks until every rank has connected (after that nobody looks).
  ~RoundName() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (ticker_.joinable()) ticker_.join();
  }
  RoundName(const RoundName&) = delete;
  RoundName& operator=(const RoundName&) = delete;

  std::string token;

 private:
  static constexpr const char* kKey = "primecfg/round";
  static std::string tick_key(const std::string& t) { return "primecfg/round_tick/" + t; }
  std::thread ticker_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

// A backend over `size` ranks of the world, this one being `rank` among them; `prefix`
// keeps each group's rendezvous keys apart in the store.
c10::intrusive_ptr<c10d::Backend> ProcessGroup::make_backend(const std::string& prefix, int rank, int size) {
  const std::chrono::milliseconds ms = timeout_;
  if (!gloo_) {
#if defined(PRIMECFG_WITH_CUDA) && defined(USE_C10D_NCCL)
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = ms;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(
        c10::make_intrusive<c10d::PrefixStore>(prefix + "nccl", store_), rank, size, opts);
#else
    throw run_error("sharded runs on CUDA need NCCL, and this primecfg-train was built without it");
#endif
  }
  auto opts = c10d::ProcessGroupGloo::Options::create(ms);
  if (launch_.gloo_interfaces.empty()) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  } else {
    std::stringstream names(launch_.gloo_interfaces);
    for (std::string name; std::getline(names, name, ',');)
      if (!name.empty()) opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>(prefix + "gloo", store_), rank, size, opts);
}

ProcessGroup::ProcessGroup(const Launch& launch, const MeshDims& mesh, torch::Device device,
                           std::chrono::seconds timeout, bool gloo)
    : launch_(launch), device_(device), gloo_(gloo || !device.is_cuda()), timeout_(timeout), mesh_(mesh) {
  if (mesh.world() != launch.world)
    throw run_error(
        fmt::format("the device mesh (dp_replicate {} x dp_shard {} x cp {}) has {} ranks, and the launch {} "
                    "(WORLD_SIZE)",
                    mesh.dp_replicate, mesh.dp_shard, mesh.cp, mesh.world(), launch.world));
  for (MeshDim d : kMeshDims) {
    groups_[index(d)] = mesh_group(mesh, d, launch.rank);
    place_[index(d)] = mesh_index(mesh, d, launch.rank);
  }
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(launch.master_port);
    so.isServer = !launch.agent_store && launch.rank == 0;
    so.numWorkers = static_cast<std::size_t>(launch.world);
    so.waitWorkers = !launch.agent_store;
    so.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, so);
    c10::intrusive_ptr<c10d::Store> base = tcp;
    if (launch.agent_store) {
      round_ = std::make_unique<RoundName>(*tcp, launch, timeout);
      base = c10::make_intrusive<c10d::PrefixStore>("primecfg/round_" + round_->token, base);
    }
    store_ = c10::make_intrusive<c10d::PrefixStore>("primecfg", base);
  } catch (const run_error&) {
    throw;
  } catch (const std::exception& e) {
    // The rank that hosts the store fails at once when it cannot listen (a port in
    // use): that is not a timeout, and the port is what the user must change.
    if (!launch.agent_store && launch.rank == 0)
      throw run_error(fmt::format("rank 0: cannot listen on {}:{} for the rendezvous store (MASTER_PORT): {}",
                                  launch.master_addr, launch.master_port, first_line(e.what())));
    throw run_error(fmt::format("rank {}: cannot reach the rendezvous store at {}:{} within {} s: {}",
                                launch.rank, launch.master_addr, launch.master_port, timeout.count(),
                                first_line(e.what())));
  }
  try {
    // Every rank walks the dimensions in the same order, so that the members of a group
    // connect it together; a group of the same ranks as an earlier one shares its
    // backend, and each group's keys in the store are its own (prefix: the dimension
    // and the group's number).
    for (MeshDim d : kMeshDims) {
      const auto& g = groups_[index(d)];
      if (g.size() < 2) continue;
      for (MeshDim e : kMeshDims) {
        if (e == d) break;
        if (groups_[index(e)] == g) backends_[index(d)] = backends_[index(e)];
      }
      if (backends_[index(d)]) continue;
      const std::string prefix =
          d == MeshDim::world ? std::string()
                              : fmt::format("{}.{}/", mesh_dim_name(d), mesh_group_id(mesh, d, launch.rank));
      backends_[index(d)] = make_backend(prefix, place_[index(d)], static_cast<int>(g.size()));
    }
  } catch (const run_error&) {
    throw;
  } catch (const std::exception& e) {
    throw run_error(fmt::format("rank {}: cannot connect the {} process group of {} ranks: {}", launch.rank,
                                gloo_ ? "Gloo" : "NCCL", launch.world, first_line(e.what())));
  }
  round_.reset();  // every rank has connected: nobody reads the round's name any more
  note_step(0);
  restart_ = max_attempt();
  heartbeat_ = std::thread([this, store = store_->clone()] {
    const std::string key = fmt::format("alive/{}", rank());
    std::unique_lock lk(heartbeat_mu_);
    while (!stop_) {
      try {
        store->set(key, std::to_string(now_ms()));
      } catch (const std::exception&) {
        return;  // the store is gone: the next collective says so
      }
      heartbeat_cv_.wait_for(lk, std::chrono::seconds(1));
    }
  });
}

ProcessGroup::~ProcessGroup() {
  {
    std::lock_guard lk(heartbeat_mu_);
    stop_ = true;
  }
  heartbeat_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  // As destroy_process_group(): NCCL's communicators and watchdog end here, not at exit
  // (a second process group in the same process needs that). After a failure the
  // peers may be gone: abort instead of waiting for them.
  // Shared backends are shut down once, the world's last.
  for (std::size_t i = kDims; i-- > 0;) {
    auto& b = backends_[i];
    bool shared = false;
    for (std::size_t j = 0; j < i; ++j) shared = shared || backends_[j] == b;
    if (!b || shared) continue;
    try {
      if (failed_)
        b->abort();
      else
        b->shutdown();
    } catch (const std::exception&) {
    }
  }
  for (auto& b : backends_) b.reset();
}

std::string_view ProcessGroup::backend_name() const {
  if (!gloo_) return "nccl";
  return device_.is_cuda() ? "gloo, through host memory" : "gloo";
}

// Which rank stopped, or which ranks are behind this one: read from the store, which
// may itself be gone (rank 0 hosts it).
std::string ProcessGroup::who_failed() {
  // A peer that died makes a collective fail at once, before its heartbeat is old
  // enough to tell: look again for a few seconds.
  std::string found;
  for (int attempt = 0; attempt < 5; ++attempt) {
    found = who_failed_now();
    if (found.rfind("no rank reported an error, none", 0) != 0) break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return found;
}

std::string ProcessGroup::who_failed_now() {
  try {
    store_->setTimeout(std::chrono::seconds(2));
    std::vector<std::string> failed, silent, behind;
    for (int r = 0; r < world(); ++r) {
      if (r == rank()) continue;
      const std::string fk = fmt::format("failed/{}", r);
      if (store_->check({fk})) failed.push_back(fmt::format("rank {} stopped: {}", r, get_str(*store_, fk)));
      const std::string ak = fmt::format("alive/{}", r);
      if (store_->check({ak})) {
        const double quiet = static_cast<double>(now_ms() - std::stoll(get_str(*store_, ak))) / 1e3;
        if (quiet > 3.0)
          silent.push_back(
              fmt::format("rank {} (no heartbeat for {:.0f} s: it died or is stopped)", r, quiet));
      }
      const std::string sk = fmt::format("step/{}", r);
      const std::int64_t at = store_->check({sk}) ? std::stoll(get_str(*store_, sk)) : -1;
      if (at < step_)
        behind.push_back(
            fmt::format("rank {} at step {}", r, at < 0 ? std::string("none") : std::to_string(at)));
    }
    store_->setTimeout(timeout_);
    if (!failed.empty()) return fmt::format("{}", fmt::join(failed, "; "));
    if (!silent.empty()) return fmt::format("no rank reported an error; gone: {}", fmt::join(silent, ", "));
    if (!behind.empty())
      return fmt::format("no rank reported an error; behind this rank (at step {}): {} (died or hangs?)",
                         step_, fmt::join(behind, ", "));
    return "no rank reported an error, none is behind this one";
  } catch (const std::exception&) {
    return fmt::format("the store at {}:{} does not answer: rank 0{} is gone", launch_.master_addr,
                       launch_.master_port, launch_.agent_store ? " or torchrun's agent" : "");
  }
}

void ProcessGroup::fail(std::string_view what, const std::exception& e) {
  failed_ = true;
  const std::string msg =
      fmt::format("rank {} of {}: {} failed ({} backend, timeout {} s): {}; {}", rank(), world(), what,
                  backend_name(), timeout_.count(), first_line(e.what()), who_failed());
  throw run_error(msg);
}

void ProcessGroup::all_reduce_sum(torch::Tensor& t, std::string_view what, MeshDim among) {
  if (size(among) == 1) return;  // a sum over one process is its own
  try {
    std::vector<torch::Tensor> ts{t};
    backend(among)->allreduce(ts)->wait();
  } catch (const run_error&) {
    throw;
  } catch (const std::exception& e) {
    fail(what, e);
  }
}

void ProcessGroup::broadcast(torch::Tensor& t, int root, std::string_view what) {
  if (world() == 1) return;
  try {
    std::vector<torch::Tensor> ts{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    backend(MeshDim::world)->broadcast(ts, o)->wait();
  } catch (const std::exception& e) {
    fail(what, e);
  }
}

void ProcessGroup::all_to_all(torch::Tensor& output, const torch::Tensor& input,
                              const std::vector<std::int64_t>& output_rows,
                              const std::vector<std::int64_t>& input_rows, std::string_view what,
                              MeshDim among) {
  const auto n = static_cast<std::size_t>(size(among));
  std::int64_t out_total = 0, in_total = 0;
  for (auto r : output_rows) out_total += r;
  for (auto r : input_rows) in_total += r;
  if (output_rows.size() != n || input_rows.size() != n || out_total != output.size(0) ||
      in_total != input.size(0) || output.sizes().slice(1) != input.sizes().slice(1))
    throw std::invalid_argument(fmt::format(
        "{}: all-to-all over {} ranks ({}) with {} output counts summing to {} for {} rows and {} input "
        "counts summing to {} for {} rows",
        what, n, mesh_dim_name(among), output_rows.size(), out_total, output.size(0), input_rows.size(),
        in_total, input.size(0)));
  if (n == 1) {
    output.copy_(input);
    return;
  }
  try {
    // c10d's split sizes are first-dimension rows, as ours; an empty piece is allowed.
    std::vector<std::int64_t> out_split(output_rows), in_split(input_rows);
    // Gloo's all-to-all has no CUDA path: ranks sharing a GPU exchange through host memory.
    const bool staged = gloo_ && input.is_cuda();
    at::Tensor in = staged ? input.cpu() : input.contiguous();
    const bool direct = output.is_contiguous() && !staged;
    at::Tensor out = direct ? output : torch::empty(output.sizes(), output.options().device(in.device()));
    backend(among)->alltoall_base(out, in, out_split, in_split)->wait();
    if (!direct) output.copy_(out);
  } catch (const std::exception& e) {
    fail(what, e);
  }
}

ProcessGroup::Pending ProcessGroup::reduce_scatter_start(std::vector<torch::Tensor>& outputs,
                                                         std::vector<torch::Tensor>& inputs, std::string what,
                                                         MeshDim among) {
  Pending p;
  if (size(among) == 1) {
    for (std::size_t i = 0; i < inputs.size(); ++i) outputs[i].copy_(inputs[i]);
    return p;
  }
  try {
    p.works_.push_back(backend(among)->reduce_scatter_tensor_coalesced(outputs, inputs));
  } catch (const std::exception& e) {
    fail(what, e);
  }
  p.group_ = this;
  p.what_ = std::move(what);
  return p;
}

ProcessGroup::Pending ProcessGroup::all_gather_start(std::vector<torch::Tensor>& outputs,
                                                     std::vector<torch::Tensor>& inputs, std::string what,
                                                     MeshDim among) {
  Pending p;
  if (size(among) == 1) {
    for (std::size_t i = 0; i < inputs.size(); ++i) outputs[i].copy_(inputs[i]);
    return p;
  }
  try {
    if (gloo_) {
      // One single-tensor all-gather per tensor: Gloo's coalesced one damages the heap when
      // other collectives are in flight (PyTorch's own, without this project's code:
      // bench/trainer/gloo_allgather_stress.py, docs/reliability.md), and it has no CUDA
      // path (it would hand device pointers to its transport), where the single-tensor
      // one stages through pinned host memory.
      for (std::size_t i = 0; i < inputs.size(); ++i)
        p.works_.push_back(backend(among)->_allgather_base(outputs[i], inputs[i]));
    } else {
      p.works_.push_back(backend(among)->allgather_into_tensor_coalesced(outputs, inputs));
    }
  } catch (const std::exception& e) {
    fail(what, e);
  }
  p.group_ = this;
  p.what_ = std::move(what);
  return p;
}

ProcessGroup::Pending::Pending() = default;
ProcessGroup::Pending::~Pending() = default;
ProcessGroup::Pending::Pending(Pending&&) noexcept = default;
ProcessGroup::Pending& ProcessGroup::Pending::operator=(Pending&&) noexcept = default;
bool ProcessGroup::Pending::active() const { return !works_.empty(); }

void ProcessGroup::Pending::wait() {
  if (works_.empty()) return;
  auto works = std::move(works_);
  works_.clear();
  try {
    for (auto& w : works) w->wait();
  } catch (const std::exception& e) {
    group_->fail(what_, e);
  }
}

std::string ProcessGroup::next_key(std::string_view what) {
  return fmt::format("round/{}/{}", rounds_++, what);
}

std::vector<std::string> ProcessGroup::next_keys(std::string_view what) {
  const std::string key = next_key(what);
  std::vector<std::string> keys;
  for (int r = 0; r < world(); ++r) keys.push_back(fmt::format("{}/{}", key, r));
  return keys;
}

std::string ProcessGroup::on_rank0(std::string_view what, const std::function<std::string()>& fn) {
  const std::string key = next_key(what);
  if (rank() == 0) {
    std::string value;
    try {
      value = fn();
    } catch (const std::exception& e) {
      store_->set(key, std::string("error:") + e.what());
      throw;
    }
    store_->set(key, "ok:" + value);
    return value;
  }
  std::string got;
  try {
    store_->wait({key});
    got = get_str(*store_, key);
  } catch (const std::exception& e) {
    fail(what, e);
  }
  if (got.rfind("error:", 0) == 0) throw run_error(fmt::format("rank 0 failed: {}", got.substr(6)));
  return got.substr(3);
}

void ProcessGroup::check_same(std::string_view what, std::uint64_t value) {
  const std::vector<std::string> keys = next_keys(what);
  std::vector<int> differ;
  try {
    store_->set(keys[static_cast<std::size_t>(rank())], fmt::format("{:016x}", value));
    store_->wait(keys);
    const std::string root = get_str(*store_, keys[0]);
    for (int r = 1; r < world(); ++r)
      if (get_str(*store_, keys[static_cast<std::size_t>(r)]) != root) differ.push_back(r);
  } catch (const std::exception& e) {
    fail(what, e);
  }
  if (!differ.empty())
    throw run_error(fmt::format(
        "{} differs between ranks: rank{} {} differ{} from rank 0 (every rank must be "
        "started with the same config files, flags and options)",
        what, differ.size() > 1 ? "s" : "", fmt::join(differ, ", "), differ.size() > 1 ? "" : "s"));
}

void ProcessGroup::agree(std::string_view what, const std::string& error) {
  const std::vector<std::string> keys = next_keys(what);
  std::string first;
  try {
    store_->set(keys[static_cast<std::size_t>(rank())], error);
    store_->wait(keys);
    for (int r = 0; r < world() && first.empty(); ++r) {
      const std::string e = get_str(*store_, keys[static_cast<std::size_t>(r)]);
      if (!e.empty()) first = r == rank() ? e : fmt::format("rank {} failed: {}", r, e);
    }
  } catch (const std::exception& e) {
    fail(what, e);
  }
  if (!first.empty()) throw run_error(first);
}

// The agents' restart counts may differ (RoundName): the round is a restart when any
// rank's count says so.
int ProcessGroup::max_attempt() {
  const std::vector<std::string> keys = next_keys("the restart count");
  int most = 0;
  try {
    store_->set(keys[static_cast<std::size_t>(rank())], std::to_string(launch_.attempt));
    store_->wait(keys);
    for (const std::string& k : keys) most = std::max(most, std::stoi(get_str(*store_, k)));
  } catch (const std::exception& e) {
    fail("agreeing on the restart count", e);
  }
  return most;
}

void ProcessGroup::note_step(std::int64_t step) {
  step_ = step;
  try {
    store_->set(fmt::format("step/{}", rank()), std::to_string(step));
  } catch (const std::exception& e) {
    fail("recording this rank's step in the store", e);
  }
}

void ProcessGroup::note_failure(const std::string& error) noexcept {
  failed_ = true;
  try {
    store_->setTimeout(std::chrono::seconds(2));
    store_->set(fmt::format("failed/{}", rank()), first_line(error));
  } catch (...) {
  }
}

}  // namespace primecfg::train
