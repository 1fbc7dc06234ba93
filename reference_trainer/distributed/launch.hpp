// Where this process stands among the ranks a launcher started: torchrun, or any
// launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT (Slurm with torchrun, a script). These variables are the launch
// protocol, not the trainer's options: they are read here and nowhere else.
//
// Internal to primecfg-train; no LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace primecfg::train {

struct Launch {
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the store, every rank
  // is a client of it.
  bool agent_store = false;
  int attempt = 0;  // TORCHELASTIC_RESTART_COUNT: this agent's restarts (ProcessGroup::restart)
  // TORCHELASTIC_RUN_ID: torchrun's id of the job, the same in each of its restarts
  // (--rdzv-id; --standalone makes one up). Empty without torchrun, "none" when a
  // multi-node job was started without --rdzv-id: no id then.
  std::string job_id;
  std::string gloo_interfaces;  // GLOO_SOCKET_IFNAME: comma-separated, empty: the default

  // Started by a launcher (RANK is set): the run goes through a process group, even
  // of one rank (every collective then runs, over one member).
  bool launched = false;

  bool several() const { return world > 1; }

  // From the environment: one process (world 1) when WORLD_SIZE is unset. A variable
  // that is set but malformed or inconsistent is an error naming it (launch_error).
  static Launch from_environment();
};

struct launch_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace primecfg::train
