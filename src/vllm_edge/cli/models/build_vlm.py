"""`vllm-edge models build-vlm`: an Idefics3 (SmolVLM-shaped) checkpoint built offline."""

from __future__ import annotations

import argparse

from vllm_edge.cli.args import add_group, add_quant, reported

NAME = "build-vlm"
HELP = ("an Idefics3 (SmolVLM-shaped) checkpoint: SmolLM2's real weights, a seeded random vision "
        "encoder (docs/guide/multimodal.md)")


def add_args(p: argparse.ArgumentParser) -> None:
    from vllm_edge.models.vlm import VisionShape, vision_formats  # torch-free at import

    p.add_argument("out", nargs="?", default=None,
                   help="output directory (default: the cached build under VLLM_EDGE_HOME)")
    add_quant(p, choices=tuple(vision_formats()),
              help="also quantize the cached build (language model, embedding and head)")
    add_group(p)
    p.add_argument("--quantize-vision", action=argparse.BooleanOptionalAction, default=False,
                   help="with --quant: quantize the vision tower's linears too (default: no; "
                        "see docs/guide/multimodal.md for the measurement)")
    p.add_argument("--force", action="store_true", help="build again even if cached; with OUT, replace it even if it is not a VLM build")
    shape = VisionShape()
    p.add_argument("--vision-hidden", type=int, default=shape.hidden)
    p.add_argument("--vision-layers", type=int, default=shape.layers)
    p.add_argument("--vision-intermediate", type=int, default=shape.intermediate)
    p.add_argument("--vision-heads", type=int, default=shape.heads)
    p.add_argument("--patch", type=int, default=shape.patch)
    p.add_argument("--image-size", type=int, default=shape.image_size,
                   help="the encoder's tile size in pixels")
    p.add_argument("--scale-factor", type=int, default=shape.scale_factor,
                   help="pixel-shuffle factor of the connector")
    p.add_argument("--longest-edge", type=int, default=None,
                   help="processor resize target; above --image-size images are split into tiles "
                        "(default: --image-size, one tile per image)")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from vllm_edge.models import store, vlm

    with reported(ValueError, FileNotFoundError):
        if args.out:
            shape = vlm.VisionShape(args.vision_hidden, args.vision_layers, args.vision_intermediate,
                                    args.vision_heads, args.patch, args.image_size, args.scale_factor,
                                    args.longest_edge or args.image_size)
            if args.quant:
                raise ValueError("--quant builds the cached default VLM; quantize a custom OUT "
                                 "with `vllm-edge quantize OUT DST --quantize-vision/--no-quantize-vision`")
            path = vlm.build(args.out, text_dir=store.prepare("default"), vision=shape,
                             seed=args.seed, force=args.force)
        else:
            path = store.prepare_vlm(args.quant, args.group, quantize_vision=args.quantize_vision,
                                     force=args.force)
    print(path)
    return 0
