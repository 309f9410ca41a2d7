// normkit_proxynorm.proxy.ReluProxyNorm for the default gn+pn layer (group standardization inside, weight, bias,
// proxy_beta, proxy_gamma, scale on), written as a C++ torch::autograd::Function that runs the same ATen ops with
// the same arguments in the same order. bench_host_floor.py builds it with torch.utils.cpp_extension, checks that
// its output and gradients equal the layer's bit for bit, and times it: what gn+pn's training call costs when
// Python's share of the host work is gone and the ops stay.
#include <torch/extension.h>

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct ReluProxy : public torch::autograd::Function<ReluProxy> {
    static Tensor forward(AutogradContext *ctx, Tensor x, Tensor weight, Tensor bias, Tensor beta, Tensor gamma,
                          Tensor row, Tensor basis, double eps, int64_t groups, double standardize_eps) {
        const int64_t channels = x.size(1);
        auto normalized = at::native_group_norm(x, {}, {}, x.size(0), channels, x.size(2), groups, standardize_eps);
        Tensor w = weight.view({1, -1, 1}), b = bias.view({1, -1, 1});
        Tensor z = at::relu(std::get<0>(normalized) * w + b);
        Tensor slope = (1 + gamma).view({1, -1, 1});
        Tensor yp = beta.view({1, -1, 1}) + slope * row;
        Tensor zp = at::relu(yp * w + b);
        auto [var, mean] = at::var_mean(zp, at::IntArrayRef{2}, /*correction=*/0, /*keepdim=*/true);
        Tensor centred = z - mean;
        Tensor rstd = at::rsqrt(var + eps);
        ctx->save_for_backward({x, weight, beta, slope, basis, z, centred, zp, mean, rstd, std::get<1>(normalized),
                                std::get<2>(normalized)});
        ctx->saved_data["groups"] = groups;
        return centred * rstd;
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        auto saved = ctx->get_saved_variables();
        Tensor x = saved[0], weight = saved[1], beta = saved[2], slope = saved[3], basis = saved[4], z = saved[5];
        Tensor centred = saved[6], zp = saved[7], mean = saved[8], rstd = saved[9];
        Tensor grad = grads[0];
        const int64_t n = zp.size(2);
        const std::vector<int64_t> dims{0, 2};
        Tensor dz = grad * rstd;
        Tensor dmean = dz.sum(dims, true).mul_(-1.0 / n);
        Tensor dvar = (grad * centred).sum(dims, true).mul_(rstd.pow(3)).mul_(-1.0 / n);
        Tensor dzp = at::addcmul(dmean, zp - mean, dvar);
        Tensor da = at::threshold_backward(dz, z, 0);
        Tensor dap = at::threshold_backward(dzp, zp, 0);
        auto [dx, dweight, dbias] = at::native_group_norm_backward(
            da, x, saved[10], saved[11], weight, x.size(0), x.size(1), x.size(2), ctx->saved_data["groups"].toInt(),
            {true, true, true});
        auto sums = at::mm(dap[0], basis).unbind(1);
        dweight.add_(at::addcmul(beta * sums[0], slope.view(-1), sums[1]));
        dbias.add_(sums[0]);
        Tensor dbeta = sums[0] * weight, dgamma = sums[1] * weight;
        return {dx, dweight, dbias, dbeta, dgamma, Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
    }
};

Tensor relu_proxy(Tensor x, Tensor weight, Tensor bias, Tensor beta, Tensor gamma, Tensor row, Tensor basis,
                  double eps, int64_t groups, double standardize_eps) {
    return ReluProxy::apply(x, weight, bias, beta, gamma, row, basis, eps, groups, standardize_eps);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("relu_proxy", &relu_proxy); }
