"""Ditto LMDM denoiser: the transformer (``MotionDecoder``) that predicts clean motion x_0 from a
noisy 80-frame motion window, a reference frame and per-frame conditions.

Structure and state_dict keys equal the official ``core/models/modules/lmdm_modules/model.py``
(checkpoint ``lmdm_v0.4_hubert.pth`` entry ``model_state_dict`` loads strictly), including the 11
copies of the shared rotary ``freqs`` buffer. Differences are in execution only:

* attention is computed with :func:`torch.nn.functional.scaled_dot_product_attention` on our own
  projection code (same parameters as ``nn.MultiheadAttention``);
* rotary cos/sin tables are computed once per forward and handed to every layer;
* :meth:`MotionDecoder.guided_forward` runs the conditional and the unconditional branch of
  classifier-free guidance in ONE batched decoder pass (the reference makes two passes), and only
  encodes the condition for the conditional half (the unconditional half uses the null embedding).

No ``.item()`` or other host synchronisation happens in the forward, so it can be captured in a
CUDA graph. Device and dtype follow the module and its inputs.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

RopeTable = tuple[Tensor, Tensor]  # (cos, sin), each [L, dim]


class RotaryEmbedding(nn.Module):
    """Rotary position encoding over the full channel width with interleaved pairs.

    ``freqs`` is a persistent buffer (it is part of the official checkpoint); the same instance is
    shared by the decoder and all of its layers.
    """

    def __init__(self, dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
        self.register_buffer("freqs", freqs)

    def table(self, length: int, device: torch.device, dtype: torch.dtype) -> RopeTable:
        """cos/sin of position·freq for positions 0..length−1, each pair channel repeated twice."""
        freqs = self.freqs.to(device=device, dtype=torch.float32)
        angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * freqs[None, :]
        angles = angles.repeat_interleave(2, dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: Tensor, rope: RopeTable) -> Tensor:
    """x·cos + rotate_half(x)·sin with rotate_half((a, b) pairs) = (−b, a); x is [..., L, dim]."""
    cos, sin = rope
    pairs = x.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return x * cos + rotated * sin


class RotaryAttention(nn.Module):
    """Multi-head attention with ``nn.MultiheadAttention``'s parameter layout (packed
    ``in_proj_weight``/``in_proj_bias`` and ``out_proj``), batch-first, no dropout at inference."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim))
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.in_proj_bias)
        nn.init.zeros_(self.out_proj.bias)

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.num_heads, -1).transpose(1, 2)

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        d = self.embed_dim
        w, bias = self.in_proj_weight, self.in_proj_bias
        if query is key:  # self-attention on rotated inputs: project q and k in one matmul
            q, k = F.linear(query, w[: 2 * d], bias[: 2 * d]).chunk(2, dim=-1)
        else:
            q = F.linear(query, w[:d], bias[:d])
            k = F.linear(key, w[d : 2 * d], bias[d : 2 * d])
        v = F.linear(value, w[2 * d :], bias[2 * d :])
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(self._heads(q), self._heads(k), self._heads(v), dropout_p=p)
        b, _, n, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class DenseFiLM(nn.Module):
    """Per-sample (scale, shift) from the time/condition vector: Mish → Linear(d, 2d)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Mish(), nn.Linear(dim, dim * 2))

    def forward(self, t: Tensor) -> tuple[Tensor, Tensor]:
        scale, shift = self.block(t)[:, None, :].chunk(2, dim=-1)
        return scale, shift


def _film(x: Tensor, scale_shift: tuple[Tensor, Tensor]) -> Tensor:
    scale, shift = scale_shift
    return (scale + 1) * x + shift


class CondEncoderLayer(nn.Module):
    """Pre-norm transformer encoder layer with rotary self-attention (queries/keys rotated
    after the layer norm, values not)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = RotaryAttention(d_model, nhead, dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)
        self.rotary = rotary  # shared instance: its `freqs` appears under this layer's prefix too

    def forward(self, x: Tensor, rope: RopeTable) -> Tensor:
        h = self.norm1(x)
        qk = apply_rotary(h, rope)
        x = x + self.drop(self.self_attn(qk, qk, h))
        x = x + self.drop(self.linear2(self.drop(F.gelu(self.linear1(self.norm2(x))))))
        return x


class FiLMDecoderLayer(nn.Module):
    """Pre-norm decoder layer: rotary self-attention, rotary cross-attention to the condition
    memory, feed-forward; each branch FiLM-modulated by the time/condition vector."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = RotaryAttention(d_model, nhead, dropout)
        self.multihead_attn = RotaryAttention(d_model, nhead, dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.film1 = DenseFiLM(d_model)
        self.film2 = DenseFiLM(d_model)
        self.film3 = DenseFiLM(d_model)
        self.drop = nn.Dropout(dropout)
        self.rotary = rotary

    def forward(self, x: Tensor, mem: Tensor, mem_rotated: Tensor, t: Tensor, rope: RopeTable) -> Tensor:
        h = self.norm1(x)
        qk = apply_rotary(h, rope)
        x = x + _film(self.drop(self.self_attn(qk, qk, h)), self.film1(t))
        h = self.norm2(x)
        x = x + _film(self.drop(self.multihead_attn(apply_rotary(h, rope), mem_rotated, mem)), self.film2(t))
        h = self.linear2(self.drop(F.gelu(self.linear1(self.norm3(x)))))
        x = x + _film(self.drop(h), self.film3(t))
        return x


class DecoderLayerStack(nn.Module):
    """Holds the decoder layers under the official ``seqTransDecoder.stack.<i>`` key names."""

    def __init__(self, layers: list[FiLMDecoderLayer]) -> None:
        super().__init__()
        self.stack = nn.ModuleList(layers)


class SinusoidalPosEmb(nn.Module):
    """Sinusoidal diffusion-time embedding [B, dim], always float32 (as the reference computes
    it): cat(sin, cos) of t·10000^(−i/(dim/2−1)), i = 0..dim/2−1."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, times: Tensor) -> Tensor:
        half = self.dim // 2
        scale = math.log(10000) / (half - 1)
        freqs = torch.exp(torch.arange(half, device=times.device, dtype=torch.float32) * -scale)
        args = times[:, None].to(torch.float32) * freqs[None, :]
        return torch.cat((args.sin(), args.cos()), dim=-1)


class MotionDecoder(nn.Module):
    """The LMDM transformer. ``forward`` is one branch (conditional or null-conditioned),
    ``guided_forward`` the classifier-free-guided prediction in one batched pass."""

    def __init__(
        self,
        nfeats: int = 265,
        seq_len: int = 80,
        latent_dim: int = 512,
        ff_size: int = 1024,
        num_layers: int = 8,
        num_heads: int = 8,
        dropout: float = 0.1,
        cond_feature_dim: int = 1103,
        multi_cond_frame: bool = False,
        num_cond_layers: int = 2,
    ) -> None:
        super().__init__()
        self.nfeats = nfeats
        self.seq_len = seq_len
        self.latent_dim = latent_dim
        self.multi_cond_frame = multi_cond_frame

        self.rotary = RotaryEmbedding(latent_dim)
        self.time_mlp = nn.Sequential(SinusoidalPosEmb(latent_dim), nn.Linear(latent_dim, latent_dim * 4), nn.Mish())
        self.to_time_cond = nn.Sequential(nn.Linear(latent_dim * 4, latent_dim))
        self.to_time_tokens = nn.Sequential(nn.Linear(latent_dim * 4, latent_dim * 2))
        self.null_cond_embed = nn.Parameter(torch.randn(1, seq_len, latent_dim))
        self.null_cond_hidden = nn.Parameter(torch.randn(1, latent_dim))
        self.norm_cond = nn.LayerNorm(latent_dim)
        in_feats = nfeats * 2 + 1 if multi_cond_frame else nfeats * 2
        self.input_projection = nn.Linear(in_feats, latent_dim)
        self.cond_encoder = nn.Sequential(
            *[CondEncoderLayer(latent_dim, num_heads, ff_size, dropout, self.rotary) for _ in range(num_cond_layers)]
        )
        self.cond_projection = nn.Linear(cond_feature_dim, latent_dim)
        self.non_attn_cond_projection = nn.Sequential(
            nn.LayerNorm(latent_dim), nn.Linear(latent_dim, latent_dim), nn.SiLU(), nn.Linear(latent_dim, latent_dim)
        )
        self.seqTransDecoder = DecoderLayerStack(
            [FiLMDecoderLayer(latent_dim, num_heads, ff_size, dropout, self.rotary) for _ in range(num_layers)]
        )
        self.final_layer = nn.Linear(latent_dim, nfeats)

    # -- pieces -------------------------------------------------------------------------------

    def _project_input(self, x: Tensor, cond_frame: Tensor) -> Tensor:
        if self.multi_cond_frame:
            xin = torch.cat([x, cond_frame], dim=-1)
        else:
            xin = torch.cat([x, cond_frame[:, None, :].expand(-1, x.shape[1], -1)], dim=-1)
        return self.input_projection(xin)

    def encode_cond(self, cond_embed: Tensor) -> tuple[Tensor, Tensor]:
        """Condition tokens [B, 80, D] (after the encoder) and their pooled FiLM vector [B, D]. They
        depend on the condition only: a DDIM loop encodes once and hands them to every step."""
        tokens = self.cond_projection(cond_embed)
        rope = self.rotary.table(tokens.shape[1], tokens.device, tokens.dtype)
        for layer in self.cond_encoder:
            tokens = layer(tokens, rope)
        return tokens, self.non_attn_cond_projection(tokens.mean(dim=-2))

    def _time(self, times: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """FiLM time vector [B, D] and the two cross-attention time tokens [B, 2, D]."""
        emb, linear, act = self.time_mlp  # the embedding is float32; the MLP runs in the model dtype
        t_hidden = act(linear(emb(times).to(dtype)))
        t_tokens = self.to_time_tokens(t_hidden).unflatten(-1, (2, self.latent_dim))
        return self.to_time_cond(t_hidden), t_tokens

    def _decode(self, x: Tensor, cond_tokens: Tensor, t_tokens: Tensor, t: Tensor) -> Tensor:
        mem = self.norm_cond(torch.cat((cond_tokens, t_tokens), dim=-2))
        rope_x = self.rotary.table(x.shape[1], x.device, x.dtype)
        mem_rotated = apply_rotary(mem, self.rotary.table(mem.shape[1], mem.device, mem.dtype))
        for layer in self.seqTransDecoder.stack:
            x = layer(x, mem, mem_rotated, t, rope_x)
        return self.final_layer(x)

    # -- entry points -------------------------------------------------------------------------

    def forward(
        self,
        x: Tensor,
        cond_frame: Tensor,
        cond_embed: Tensor,
        times: Tensor,
        cond_drop_prob: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """One branch: x [B, L, nfeats], cond_frame [B, nfeats], cond_embed [B, 80, C], times [B]
        (int). ``cond_drop_prob`` 0 keeps the condition, 1 replaces it by the null embeddings;
        values in between drop per sample (random, from ``generator``)."""
        b = x.shape[0]
        h = self._project_input(x, cond_frame)
        cond_tokens, cond_hidden = self.encode_cond(cond_embed)
        if cond_drop_prob > 0.0:
            if cond_drop_prob >= 1.0:
                keep = torch.zeros(b, dtype=torch.bool, device=x.device)
            else:
                keep = torch.rand(b, device=x.device, generator=generator) < 1.0 - cond_drop_prob
            null_tokens = self.null_cond_embed.to(cond_tokens.dtype)
            cond_tokens = torch.where(keep[:, None, None], cond_tokens, null_tokens)
            cond_hidden = torch.where(keep[:, None], cond_hidden, self.null_cond_hidden.to(cond_hidden.dtype))
        t, t_tokens = self._time(times, h.dtype)
        return self._decode(h, cond_tokens, t_tokens, t + cond_hidden)

    def guided_branches(self, x: Tensor, cond_frame: Tensor, cond_embed: Tensor, times: Tensor,
                        encoded: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """(conditional, unconditional) outputs from one batched decoder pass of size 2B
        (``encoded``: ``encode_cond(cond_embed)`` when the caller has it already)."""
        b = x.shape[0]
        h = self._project_input(x, cond_frame)
        cond_tokens, cond_hidden = encoded if encoded is not None else self.encode_cond(cond_embed)
        t, t_tokens = self._time(times, h.dtype)
        null_tokens = self.null_cond_embed.to(cond_tokens.dtype).expand(b, -1, -1)
        null_hidden = self.null_cond_hidden.to(cond_hidden.dtype).expand(b, -1)
        out = self._decode(
            torch.cat([h, h]),
            torch.cat([cond_tokens, null_tokens]),
            torch.cat([t_tokens, t_tokens]),
            torch.cat([t + cond_hidden, t + null_hidden]),
        )
        return out[:b], out[b:]

    def guided_forward(
        self, x: Tensor, cond_frame: Tensor, cond_embed: Tensor, times: Tensor, guidance_weight: float
    ) -> Tensor:
        """Classifier-free guidance: uncond + (cond − uncond)·w."""
        cond, unc = self.guided_branches(x, cond_frame, cond_embed, times)
        return unc + (cond - unc) * guidance_weight
