// The ranks of a sharded run, connected through PyTorch's own distributed engine
// (c10d): a TCPStore for rendezvous and small messages, and a process group for the
// collectives (Gloo for CPU tensors, NCCL for CUDA ones).
//
// Every collective names what it is for. When one fails or times out (a rank died,
// hangs, or stopped with an error), the error says which rank: each rank records in
// the store a heartbeat every second (from a thread of its own, so a rank waiting in
// a collective still beats), the step it reached and, when it stops on an error, the
// error; the survivors read them.
//
// Internal to primecfg-train.
#pragma once

#include "distributed/launch.hpp"
#include "distributed/mesh.hpp"

#include <torch/torch.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace c10d {
class Store;
class Backend;
class Work;
}  // namespace c10d

namespace primecfg::train {

class RoundName;  // process_group.cpp

class ProcessGroup {
 public:
  // Connects to the other ranks (rank 0 hosts the store, or torchrun's agent does when
  // TORCHELASTIC_USE_AGENT_STORE is set) and creates a backend for `device`'s tensors
  // along each dimension of `mesh` (distributed/mesh.hpp) that has more than one rank.
  // `timeout` bounds every collective and every wait on the store. `gloo`: Gloo even
  // for CUDA tensors (through host memory; ranks may then share a GPU). The mesh's
  // world must be the launch's.
  ProcessGroup(const Launch& launch, const MeshDims& mesh, torch::Device device, std::chrono::seconds timeout,
               bool gloo = false);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // torchrun's restart count of this round: the largest over the ranks (the agents
  // need not agree), 0 without torchrun.
  int restart() const { return restart_; }
  int rank() const { return launch_.rank; }
  int world() const { return launch_.world; }
  const MeshDims& mesh() const { return mesh_; }
  // This rank's group along a dimension of the mesh: its size and this rank's place in it.
  int size(MeshDim d) const { return static_cast<int>(groups_[index(d)].size()); }
  int index_in(MeshDim d) const { return place_[index(d)]; }
  // HSDP's view of the mesh: the ranks that split the dense weights (a shard group) and
  // the replicas of it. Without replication the one shard group is the world.
  int replicas() const { return mesh_.dp_replicate; }
  int replica() const { return index_in(MeshDim::replicate); }
  int shard_world() const { return size(MeshDim::fsdp); }
  int shard_rank() const { return index_in(MeshDim::fsdp); }
  const Launch& launch() const { return launch_; }
  torch::Device device() const { return device_; }
  std::string_view backend_name() const;

  // --- collectives over tensors on device() (blocking on the host for Gloo, also on
  // CUDA tensors; for NCCL the current stream waits for them) -----------------------
  // A sum over this rank's group along `among` (every rank, its shard group, the ranks
  // of the other shard groups holding the same piece, ...).
  void all_reduce_sum(torch::Tensor& t, std::string_view what, MeshDim among = MeshDim::world);
  // All-to-all with per-rank counts over this rank's group along `among` (expert
  // parallelism's token exchange): input's first-dimension rows, in member order,
  // input_rows[j] of them to member j; output gets output_rows[j] rows from member j, in
  // member order. The counts are rows of the first dimension (the other dimensions are
  // the same everywhere); every member's output_rows[j] must be member j's
  // input_rows[this member]. Blocking as the other collectives are.
  void all_to_all(torch::Tensor& output, const torch::Tensor& input,
                  const std::vector<std::int64_t>& output_rows, const std::vector<std::int64_t>& input_rows,
                  std::string_view what, MeshDim among);
  void broadcast(torch::Tensor& t, int root, std::string_view what);
  // A collective in flight. wait() before its outputs are read: for Gloo the host
  // waits, for NCCL the current stream does (the host goes on).
  class Pending {
   public:
    Pending();
    ~Pending();
    Pending(Pending&&) noexcept;
    Pending& operator=(Pending&&) noexcept;
    bool active() const;
    void wait();

   private:
    friend class ProcessGroup;
    ProcessGroup* group_ = nullptr;
    std::vector<c10::intrusive_ptr<c10d::Work>> works_;
    std::string what_;
  };
  // Within this rank's group along `among` (the shard group, or the ranks that split one
  // expert-parallel rank's experts), started: they run while the caller goes on, and
  // their inputs and outputs must stay alive until wait() returns. In a group of one
  // they are copies queued on the current stream, with no backend call (whose launch,
  // streams and events cost host time for nothing; docs/performance.md).
  // All-gather (FSDP's prefetch): outputs[i] has size(among) * inputs[i].numel()
  // elements, every member's input in member order.
  Pending all_gather_start(std::vector<torch::Tensor>& outputs, std::vector<torch::Tensor>& inputs,
                           std::string what, MeshDim among = MeshDim::fsdp);
  // Reduce-scatter (FSDP's gradient buckets): inputs[i] has size(among) *
  // outputs[i].numel() elements; member r gets the sum of piece r.
  Pending reduce_scatter_start(std::vector<torch::Tensor>& outputs, std::vector<torch::Tensor>& inputs,
                               std::string what, MeshDim among = MeshDim::fsdp);

  // --- over the store --------------------------------------------------------------
  // Rank 0 runs `fn` and hands its result (or its error) to every rank: what only one
  // rank must do (claim the output folder), with a value all need (the resume step).
  std::string on_rank0(std::string_view what, const std::function<std::string()>& fn);
  // Every rank has the same `value` (a hash of its config), else an error naming the
  // ranks that differ from rank 0.
  void check_same(std::string_view what, std::uint64_t value);
  // Every rank got here without an error; else every rank fails, naming the first
  // rank that had one (`error`: this rank's, empty when none).
  void agree(std::string_view what, const std::string& error);
  // This rank is at `step` (for naming the ranks behind when a collective times out).
  void note_step(std::int64_t step);
  // This rank stops on `error`: the others name it when their collectives fail.
  void note_failure(const std::string& error) noexcept;

 private:
  [[noreturn]] void fail(std::string_view what, const std::exception& e);
  std::string who_failed();
  std::string who_failed_now();
  std::string next_key(std::string_view what);
  std::vector<std::string> next_keys(std::string_view what);  // one key per rank
  int max_attempt();

  Launch launch_;
  torch::Device device_;
  bool gloo_;  // Gloo's collectives (on CPU tensors, or CUDA ones through host memory)
  std::chrono::seconds timeout_;
  std::unique_ptr<RoundName> round_;  // torchrun's agent store: this round's key space
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> make_backend(const std::string& prefix, int rank, int size);
  static std::size_t index(MeshDim d) { return static_cast<std::size_t>(d); }
  // A dimension's backend; null where the group is this rank alone.
  c10d::Backend* backend(MeshDim d) const { return backends_[index(d)].get(); }
  static constexpr std::size_t kDims = std::size(kMeshDims);
  MeshDims mesh_;
  std::array<std::vector<int>, kDims> groups_;  // this rank's group along each dimension
  std::array<int, kDims> place_{};              // this rank's place in it
  // Groups with the same ranks share one backend (the shard group is the world without
  // HSDP): each distinct group is connected once.
  std::array<c10::intrusive_ptr<c10d::Backend>, kDims> backends_;
  int restart_ = 0;
  std::int64_t step_ = 0;
  std::thread heartbeat_;
  std::mutex heartbeat_mu_;
  std::condition_variable heartbeat_cv_;
  bool stop_ = false;
  bool failed_ = false;       // a collective failed or this rank stops on an error
  std::uint64_t rounds_ = 0;  // store keys of on_rank0 / check_same / agree, in call order
};

}  // namespace primecfg::train
