"""A small Vision Transformer (Dosovitskiy et al. 2021) for small images, registered as "vit_small".

Patch embedding (a strided conv), a learned class token and position embeddings, `depth`
pre-norm transformer blocks, a final LayerNorm; the features are the class token's output.
Defaults suit 32x32 inputs: 4x4 patches (64 tokens), width 192, 6 blocks, 3 heads, MLP
ratio 2 (1.8M parameters with 10 classes). This is a small ViT for CIFAR-sized data, not
timm's ViT-S/16 (22M).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from calib_core.models.classifier import Classifier
from calib_core.models.registry import register_model


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(o.transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


@register_model("vit_small")
class ViT(Classifier):
    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...],
        patch_size: int = 4,
        embed_dim: int = 192,
        depth: int = 6,
        num_heads: int = 3,
        mlp_ratio: float = 2.0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(num_classes, input_shape)
        if len(self.input_shape) != 3:
            raise ValueError(f"vit_small needs input_shape (C, H, W), got {input_shape!r}")
        c, h, w = self.input_shape
        if not isinstance(patch_size, int) or patch_size < 1 or h % patch_size or w % patch_size:
            raise ValueError(f"vit_small: patch_size must divide the image size {h}x{w}, got {patch_size!r}")
        if not isinstance(embed_dim, int) or not isinstance(num_heads, int) or num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"vit_small: embed_dim ({embed_dim!r}) must be a multiple of num_heads ({num_heads!r})")
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"vit_small: depth must be a positive int, got {depth!r}")
        if not 0.0 <= dropout < 1.0 or mlp_ratio <= 0:
            raise ValueError(f"vit_small: need 0 <= dropout < 1 and mlp_ratio > 0, got {dropout!r}, {mlp_ratio!r}")
        num_patches = (h // patch_size) * (w // patch_size)
        self.patch_embed = nn.Conv2d(c, embed_dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, embed_dim))
        self.pos_drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(Block(embed_dim, num_heads, mlp_ratio, dropout) for _ in range(depth)))
        self.norm = nn.LayerNorm(embed_dim)
        self._make_head(embed_dim)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch_embed(x).flatten(2).transpose(1, 2)  # (N, P, D)
        t = torch.cat([self.cls_token.expand(t.shape[0], -1, -1), t], dim=1)
        t = self.blocks(self.pos_drop(t + self.pos_embed))
        return self.norm(t[:, 0])
