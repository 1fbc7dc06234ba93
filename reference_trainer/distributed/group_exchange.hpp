// The token exchange of nn/token_exchange.hpp over one dimension of a process group's
// mesh (expert parallelism: MeshDim::ep).
//
// Internal to primecfg-train.
#pragma once

#include "distributed/process_group.hpp"
#include "nn/token_exchange.hpp"

#include <string>

namespace primecfg::train {

class GroupExchange final : public TokenExchange {
 public:
  // `what` names the exchange in errors (a rank that died mid-way, a timeout).
  GroupExchange(ProcessGroup& group, MeshDim along, std::string what)
      : group_(group), along_(along), what_(std::move(what)) {}
  int ranks() const override { return group_.size(along_); }
  int index() const override { return group_.index_in(along_); }
  void all_to_all(torch::Tensor& out, const torch::Tensor& in, const std::vector<std::int64_t>& out_rows,
                  const std::vector<std::int64_t>& in_rows) override {
    group_.all_to_all(out, in, out_rows, in_rows, what_, along_);
  }

 private:
  ProcessGroup& group_;
  MeshDim along_;
  std::string what_;
};

}  // namespace primecfg::train
