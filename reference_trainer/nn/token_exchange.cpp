#include "nn/token_exchange.hpp"

#include "base/mapped_copies.hpp"

#include <numeric>

namespace primecfg::train {

using torch::Tensor;

std::vector<std::int64_t> exchange_counts(TokenExchange& ex, const std::vector<std::int64_t>& send_rows,
                                          torch::Device device) {
  TORCH_CHECK(static_cast<int>(send_rows.size()) == ex.ranks(), "exchange_counts: ", send_rows.size(),
              " counts for ", ex.ranks(), " ranks");
  // One row (one count) to and from each member; NCCL needs them on the device.
  Tensor send = dev::upload_ints(send_rows, {ex.ranks()}, device);
  Tensor recv = torch::empty_like(send);
  const std::vector<std::int64_t> ones(send_rows.size(), 1);
  ex.all_to_all(recv, send, ones, ones);
  return dev::read_back_ints(recv);
}

namespace {

std::vector<std::int64_t> to_vector(const c10::IValue& v) { return v.toIntVector(); }

Tensor run(TokenExchange& ex, const Tensor& x, const std::vector<std::int64_t>& send_rows,
           const std::vector<std::int64_t>& recv_rows) {
  auto sizes = x.sizes().vec();
  sizes[0] = std::accumulate(recv_rows.begin(), recv_rows.end(), std::int64_t{0});
  Tensor out = torch::empty(sizes, x.options());
  ex.all_to_all(out, x, recv_rows, send_rows);
  return out;
}

// The all-to-all as an autograd node: its adjoint is the same exchange with the counts
// swapped (what went from i to j comes back from j to i).
struct ExchangeRows : torch::autograd::Function<ExchangeRows> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x, TokenExchange* ex,
                        const std::vector<std::int64_t>& send_rows,
                        const std::vector<std::int64_t>& recv_rows) {
    ctx->saved_data["ex"] = reinterpret_cast<std::int64_t>(ex);
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    return run(*ex, x, send_rows, recv_rows);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto* ex = reinterpret_cast<TokenExchange*>(ctx->saved_data["ex"].toInt());
    Tensor g = run(*ex, grad_out[0].contiguous(), to_vector(ctx->saved_data["recv"]),
                   to_vector(ctx->saved_data["send"]));
    return {g, Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace

Tensor exchange_rows(TokenExchange& ex, const Tensor& x, const std::vector<std::int64_t>& send_rows,
                     const std::vector<std::int64_t>& recv_rows) {
  return ExchangeRows::apply(x, &ex, send_rows, recv_rows);
}

}  // namespace primecfg::train
