"""Golden fixtures for TripoSplat's background remover (upstream BiRefNet), from upstream's own classes.

Run in the reference environment (scripts/setup_triposplat_ref.sh: upstream model.py at a78fa12 and torchvision,
whose deform_conv2d upstream calls):

    OMP_NUM_THREADS=1 /work/main/.cache/triposplat-ref-venv/bin/python scripts/make_triposplat_background_goldens.py

Upstream's BiRefNet takes no arguments (Swin-L, 1024²). The tiny network is built from upstream's own classes at
smaller widths: its Swin backbone assembled like `_SwinLarge.__init__` from `_SwinPatchEmbed` / `_SwinBasicLayer`
with the tiny dims, and its decoder blocks' hard-coded widths (`_ASPPDeformable`'s inter 256, `_BasicDecBlk`'s and
`_SimpleConvs`' 64) replaced by upstream modules built at the tiny widths. Every forward that runs is upstream's
code. Seeded weights (rounded to fp16 and stored so: the file stays small and the values are exact in fp32), with
BatchNorm statistics, norm affines and the relative-position tables perturbed so that none is the identity, and the
offset convolutions scaled so that samples land between pixels and some outside the map, and the output head
scaled so that the matte is not flat.

Writes `weights=tiny`'s part models/triposplat/tiny/background_remover/ (model.safetensors + config.json, listed in
tiny/model_index.json) and models/triposplat/golden/background_tiny_io.safetensors: the image in [0, 1], upstream's
backbone features (after the multi-scale concat), its logits and alpha (BiRefNet.forward on the ImageNet-normalised
image), and one of its deformable convolutions' input/offset/mask/output (torchvision's deform_conv2d).
No zoo import: CI never runs this; tests/test_triposplat_background.py compares the port with what it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

import model as upstream          # upstream model.py, on the reference venv's path

PACKAGE = Path(__file__).resolve().parent.parent / "models" / "triposplat"
OUT = PACKAGE / "golden"
TINY_PART = PACKAGE / "tiny" / "background_remover"
SEED = 0
# the fields of models/triposplat/background.py BiRefNetConfig; upstream's are 1024 / 192 / (2, 2, 18, 2) /
# (6, 12, 24, 48) / 12 / 4.0 / 64 / 256 / (1, 3, 7) / 64 / 16
TINY = dict(image_size=64, embed_dim=8, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4], window_size=3, mlp_ratio=2.0,
            block_channels=4, aspp_channels=4, aspp_kernels=[1, 3, 7], patch_channels=2, gdt_channels=16)


def tiny_swin(cfg: dict) -> nn.Module:
    """upstream _SwinLarge's __init__ with the tiny dims (same attributes, upstream's classes)."""
    bb = upstream._SwinLarge.__new__(upstream._SwinLarge)
    nn.Module.__init__(bb)
    e, depths = cfg["embed_dim"], cfg["depths"]
    bb.num_layers, bb.embed_dim = len(depths), e
    bb.patch_embed = upstream._SwinPatchEmbed(patch_size=4, in_channels=3, embed_dim=e)
    bb.layers = nn.ModuleList([
        upstream._SwinBasicLayer(dim=e * 2 ** i, depth=depths[i], num_heads=cfg["num_heads"][i],
                                 window_size=cfg["window_size"], mlp_ratio=cfg["mlp_ratio"],
                                 downsample=i < len(depths) - 1)
        for i in range(len(depths))])
    bb.num_features = [e * 2 ** i for i in range(len(depths))]
    for i, f in enumerate(bb.num_features):
        bb.add_module(f"norm{i}", nn.LayerNorm(f))
    return bb


def dec_block(cin: int, cout: int, cfg: dict) -> nn.Module:
    """upstream _BasicDecBlk(inter_channels=block_channels) with its _ASPPDeformable's `inter = 256` and kernel
    sizes replaced by upstream modules at the tiny width."""
    blk = upstream._BasicDecBlk(cin, cout, inter_channels=cfg["block_channels"])
    aspp, c, inter, kernels = blk.dec_att, cfg["block_channels"], cfg["aspp_channels"], cfg["aspp_kernels"]
    aspp.aspp1 = upstream._ASPPModuleDeformable(c, inter, 1, padding=0)
    aspp.aspp_deforms = nn.ModuleList([upstream._ASPPModuleDeformable(c, inter, k, padding=k // 2) for k in kernels])
    aspp.global_avg_pool = nn.Sequential(nn.AdaptiveAvgPool2d((1, 1)), nn.Conv2d(c, inter, 1, stride=1, bias=False),
                                         nn.BatchNorm2d(inter), nn.ReLU(inplace=True))
    aspp.conv1 = nn.Conv2d(inter * (2 + len(kernels)), c, 1, bias=False)
    return blk


def tiny_birefnet(cfg: dict) -> nn.Module:
    net = upstream.BiRefNet.__new__(upstream.BiRefNet)
    nn.Module.__init__(net)
    net.bb = tiny_swin(cfg)
    c = tuple(2 * f for f in reversed(net.bb.num_features))
    net.squeeze_module = nn.Sequential(dec_block(c[0] + sum(c[1:]), c[0], cfg))
    dec = upstream._BiRefNetDecoder(channels=c)
    pc = cfg["patch_channels"]
    for name in ("ipt_blk5", "ipt_blk4", "ipt_blk3", "ipt_blk2", "ipt_blk1"):
        old = getattr(dec, name)
        setattr(dec, name, upstream._SimpleConvs(old.conv1.in_channels, old.conv_out.out_channels, inter_channels=pc))
    for name in ("decoder_block4", "decoder_block3", "decoder_block2", "decoder_block1"):
        old = getattr(dec, name)
        setattr(dec, name, dec_block(old.conv_in.in_channels, old.conv_out.out_channels, cfg))
    net.decoder = dec
    return net.eval()


def seed_weights(net: nn.Module) -> None:
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, module in net.named_modules():
            if isinstance(module, nn.BatchNorm2d):
                n = module.num_features
                module.running_mean.copy_(0.5 * torch.randn(n, generator=g))
                module.running_var.copy_(torch.exp(torch.empty(n).uniform_(-1.0, 1.0, generator=g)))
                module.weight.copy_(1 + 0.2 * torch.randn(n, generator=g))
                module.bias.copy_(0.2 * torch.randn(n, generator=g))
            elif isinstance(module, nn.LayerNorm):
                module.weight.copy_(1 + 0.2 * torch.randn(module.weight.shape, generator=g))
                module.bias.copy_(0.2 * torch.randn(module.bias.shape, generator=g))
            elif isinstance(module, upstream._WindowAttention):
                module.relative_position_bias_table.copy_(0.5 * torch.randn(
                    module.relative_position_bias_table.shape, generator=g))
            elif isinstance(module, upstream._DeformableConv2d):
                # offsets of a few pixels (default init gives ~0.5): samples between pixels and past the border
                module.offset_conv.weight.mul_(4.0)
                module.offset_conv.bias.copy_(torch.randn(module.offset_conv.bias.shape, generator=g))
        # the seeded head is nearly flat (logit std ~0.07): scaled so the matte spans most of (0, 1)
        net.decoder.conv_out1[0].weight.mul_(30.0)
        for p in net.parameters():   # exact in fp16, so the fp16 file holds the very weights upstream ran
            p.copy_(p.half().float())
        for name, b in net.named_buffers():
            if b.is_floating_point():
                b.copy_(b.half().float())


def main() -> None:
    torch.manual_seed(SEED)
    net = tiny_birefnet(TINY)
    seed_weights(net)
    state = net.state_dict()
    stored = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in state.items()}
    OUT.mkdir(parents=True, exist_ok=True)
    TINY_PART.mkdir(parents=True, exist_ok=True)
    save_file(stored, TINY_PART / "model.safetensors")
    (TINY_PART / "config.json").write_text(json.dumps(TINY, indent=1) + "\n")
    index_path = TINY_PART.parent / "model_index.json"
    index = json.loads(index_path.read_text())
    index["background_remover"] = ["triposplat", "upstream a78fa12 BiRefNet classes, tiny widths "
                                   "(scripts/make_triposplat_background_goldens.py)"]
    index_path.write_text(json.dumps(index, indent=2) + "\n")

    g = torch.Generator().manual_seed(SEED + 2)
    s = TINY["image_size"]
    image = torch.rand(1, 3, s, s, generator=g)
    mean = torch.tensor(upstream.BiRefNet._NORM_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(upstream.BiRefNet._NORM_STD).view(1, 3, 1, 1)
    x = (image - mean) / std
    io = {"image": image}
    captured = {}
    deform = net.decoder.decoder_block2.dec_att.aspp_deforms[1].atrous_conv     # a 3x3 one, 8x8 map
    hook = deform.register_forward_hook(lambda m, args, out: captured.update(input=args[0], output=out))
    with torch.no_grad():
        x1, x2, x3, x4 = net._forward_enc(x)
        logits = net.decoder(x, x1, x2, x3, net.squeeze_module(x4))
        alpha = net(x)
        hook.remove()
        d_in = captured["input"]
        io["deform.input"] = d_in
        io["deform.offset"] = deform.offset_conv(d_in)
        io["deform.mask"] = 2.0 * torch.sigmoid(deform.modulator_conv(d_in))
        io["deform.weight"] = deform.regular_conv.weight
        io["deform.output"] = captured["output"]
    io.update({"x1": x1, "x2": x2, "x3": x3, "x4": x4, "logits": logits, "alpha": alpha})
    save_file({k: v.contiguous() for k, v in io.items()}, OUT / "background_tiny_io.safetensors")
    params = sum(p.numel() for p in net.parameters())
    provenance_path = OUT / "provenance.json"
    provenance = json.loads(provenance_path.read_text())
    provenance["background"] = {"config": TINY, "seed": SEED, "io_seed": SEED + 2, "keys": len(state),
                                "params": params, "weights_dtype": "float16",
                                "deform_layer": "decoder.decoder_block2.dec_att.aspp_deforms.1.atrous_conv"}
    provenance_path.write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
    off = io["deform.offset"]
    print(f"[background goldens] {len(state)} keys, {params} parameters; logits in [{logits.min():.3f}, "
          f"{logits.max():.3f}], alpha std {alpha.std():.3f}; sampled offsets |max| {off.abs().max():.2f} px")


if __name__ == "__main__":
    main()
