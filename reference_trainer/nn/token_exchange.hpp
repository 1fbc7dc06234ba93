// How a block hands rows of tokens to other ranks and takes rows back: expert
// parallelism's dispatch (tokens to the ranks that hold their experts) and combine
// (the experts' outputs back). Declared here, so that a block uses it without knowing
// c10d; the ranks implement it (distributed/group_exchange.hpp), and a run of one
// rank needs none.
//
// Internal to nn/ and what implements it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace primecfg::train {

class TokenExchange {
 public:
  virtual ~TokenExchange() = default;
  // The members of the group the rows travel in, and this rank's place among them.
  virtual int ranks() const = 0;
  virtual int index() const = 0;
  // One all-to-all: in's rows, in member order, in_rows[j] of them to member j; out gets
  // out_rows[j] rows from member j, in member order. out_rows[j] must be what member j
  // sends here (exchange_counts tells it).
  virtual void all_to_all(torch::Tensor& out, const torch::Tensor& in,
                          const std::vector<std::int64_t>& out_rows,
                          const std::vector<std::int64_t>& in_rows) = 0;
};

// What each member sends this one: element j of the result is member j's send_rows[index()].
std::vector<std::int64_t> exchange_counts(TokenExchange& ex, const std::vector<std::int64_t>& send_rows,
                                          torch::Device device);

// x's rows sent as send_rows says and recv_rows received ([sum(recv_rows), ...]);
// differentiable: the output's gradient travels back by the reverse exchange. `ex` must
// outlive the backward pass.
torch::Tensor exchange_rows(TokenExchange& ex, const torch::Tensor& x,
                            const std::vector<std::int64_t>& send_rows,
                            const std::vector<std::int64_t>& recv_rows);

}  // namespace primecfg::train
