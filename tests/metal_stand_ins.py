"""mlx-lm's Muse Spark computes with Metal kernels of its own (mlx_lm.kernels), which have no CPU
or CUDA implementation, so off Apple silicon mlx-lm cannot run it and streamer refuses it at load.
These stand-ins compute what each kernel's source computes, with MLX ops; conftest.py puts them
in the model file's namespace for the whole session where Metal is absent. mlx-lm's resident model
and the streamed one then call the same functions: streaming changes only the expert containers,
and equal outputs show it computes what mlx-lm's own model computes with the same kernels."""

from __future__ import annotations

import mlx.core as mx

F32 = mx.float32


def _rstd(x: mx.array, eps: float) -> mx.array:
    return mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + eps)


def expert_routing(logits, expert_bias, *, top_k, multiplier, score_eps, route_scale):
    """Sigmoid scores, the top k by score plus bias, their scores renormalized and scaled."""
    scores = mx.sigmoid(logits.astype(F32) * multiplier)
    inds = mx.argsort(-(scores + expert_bias), axis=-1)[..., :top_k]
    chosen = mx.take_along_axis(scores, inds, axis=-1)
    weights = chosen / (chosen.sum(axis=-1, keepdims=True) + score_eps) * route_scale
    return [inds.astype(mx.uint32), weights]


def _pre_norm(stream: mx.array, weight: mx.array, eps: float, dtype: mx.Dtype) -> mx.array:
    return (stream * _rstd(stream, eps) * weight.astype(F32)).astype(dtype)


def norm_add_norm(branch, stream, *, alpha, beta, post_weight, post_eps, next_norm):
    """Post-norm the branch, add it to the float32 stream with the gate weights, pre-norm the
    sum."""
    dtype = branch.dtype
    v = branch.astype(F32)
    if post_weight is not None:  # the weight scales the input, rounded to the branch's dtype
        v = (post_weight.astype(dtype).astype(F32) * v).astype(dtype).astype(F32)
    normed = (v * _rstd(v, post_eps)).astype(dtype).astype(F32)
    new_stream = alpha * stream + beta * normed
    if next_norm is None:
        return new_stream, None
    return new_stream, _pre_norm(new_stream, next_norm.weight, next_norm.eps, dtype)


def pre_norm(stream, norm, *, dtype):
    return _pre_norm(stream, norm.weight, norm.eps, dtype)


def post_expert_norm_combine(experts, weights, *, norm_weight, eps):
    """Each expert output normed (norm_weight scaling its input), summed with its weight."""
    dtype = experts.dtype
    x = experts.astype(F32) * norm_weight.astype(F32)
    scaled = x * _rstd(x, eps) * weights.astype(dtype).astype(F32)[..., None]
    acc = mx.zeros(scaled.shape[:-2] + scaled.shape[-1:], F32)
    for k in range(scaled.shape[-2]):  # rounded to the dtype after each expert, as the kernel
        acc = (acc + scaled[..., k, :]).astype(dtype).astype(F32)
    return acc.astype(dtype)


def qk_norm(qkvg, *, n_heads, n_kv_heads, head_dim, eps, query_scale):
    """The q and k heads of each qkvg row normed, q scaled: q [..., H, D], k [..., HK, D]."""
    dtype, heads = qkvg.dtype, n_heads + n_kv_heads
    qk = qkvg[..., : heads * head_dim].astype(F32)
    qk = qk.reshape(*qkvg.shape[:-1], heads, head_dim)
    y = (qk * _rstd(qk, eps)).astype(dtype)
    q = (y[..., :n_heads, :].astype(F32) * query_scale).astype(dtype)
    return [q, y[..., n_heads:, :]]


def qk_norm_rope(qkvg, *, n_heads, n_kv_heads, head_dim, eps, query_scale, rope_base, offset):
    """qk_norm, then mx.fast.rope(traditional=True) at positions offset, offset + 1, ..."""
    q, k = qk_norm(
        qkvg,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        eps=eps,
        query_scale=query_scale,
    )

    def rotate(x):  # [B, L, H, D] -> rope over L -> back
        rotated = mx.fast.rope(
            x.swapaxes(-2, -3), head_dim, traditional=True, base=rope_base, scale=1.0, offset=offset
        )
        return rotated.swapaxes(-2, -3)

    return [rotate(q), rotate(k)]


def rms_norm_sigmoid_gate(x, gate, *, eps):
    """rms_norm(x) * sigmoid(gate) per head: x [B, H, L, D], gate [B, L, H * D]."""
    B, H, L, D = x.shape
    xf = x.astype(F32)
    normed = (xf * _rstd(xf, eps)).swapaxes(1, 2).reshape(B, L, H * D)
    return (normed * mx.sigmoid(gate.astype(F32))).astype(x.dtype)


KERNELS = {
    f.__name__: f
    for f in (
        expert_routing,
        norm_add_norm,
        pre_norm,
        post_expert_norm_combine,
        qk_norm,
        qk_norm_rope,
        rms_norm_sigmoid_gate,
    )
}
