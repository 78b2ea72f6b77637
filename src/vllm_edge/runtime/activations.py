"""Int8 or bf16 activations in the cpu_int4 and cpu_int8 products, by the engine's priority.

On a CPU with AVX512-VNNI, cpu_int4's product and cpu_int8's (5-, 6- and 8-bit codes) round each
activation row to int8 per weight group and multiply with VPDPBUSD (docs/design/cpu-int4.md,
"Int8 activations on AVX512-VNNI"): about half the instructions per weight, at a small cost in
agreement with llama.cpp on the same file, though llama.cpp rounds its own activations the
same way. ``--priority speed`` (the default) keeps them on; ``--priority fidelity`` turns both
off, so its weight path's promise that W4A16 keeps activations in bf16 holds. A value the user
set is kept.

Torch-free: the engine's environment is decided before vLLM is imported, and the kernels read
the switches when they load.
"""

from __future__ import annotations

SWITCHES = ("VLLM_EDGE_INT4_ACT8", "VLLM_EDGE_LOWBIT_ACT8")
# the reasons line is keyed by the first; the second always takes the same value
KEY = SWITCHES[0]


def apply(env: dict[str, str], reasons: dict[str, str], priority: str, vnni: bool) -> None:
    """Decide the two switches for an engine at ``priority`` on a CPU with (``vnni``) or
    without AVX512-VNNI: into ``env`` and ``reasons``, in place."""
    from vllm_edge import envs

    given = [name for name in SWITCHES if envs.is_set(name)]
    if given:
        reasons[KEY] = ", ".join(f"{k}={int(envs.get(k))}" for k in given) + " given in the environment"
        return
    on = vnni and priority != "fidelity"
    for name in SWITCHES:
        env[name] = "1" if on else "0"
    if not vnni:
        reasons[KEY] = "bf16 activations in the cpu_int4 and cpu_int8 products: this CPU has no AVX512-VNNI"
    elif not on:
        reasons[KEY] = ("bf16 activations in the cpu_int4 and cpu_int8 products, as priority fidelity "
                        "promises (priority speed rounds them to int8 per weight group)")
    else:
        reasons[KEY] = ("activations rounded to int8 per weight group in the cpu_int4 and cpu_int8 products "
                        "and multiplied with AVX512-VNNI's VPDPBUSD, as llama.cpp rounds its own "
                        "(priority speed; --priority fidelity keeps bf16; VLLM_EDGE_LOWBIT_ACT8 "
                        "follows)")
