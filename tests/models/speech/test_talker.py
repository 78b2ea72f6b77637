"""The talker checkpoint without an engine: its build on a tiny Llama (layout, config block,
tokenizer, refusal to overwrite, cpu_int4 with the head kept bf16), and the one-step frame
trick read back through vLLM's own logprob gathering."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from vllm_edge.common.atomic import DestinationError
from vllm_edge.models import synthetic
from vllm_edge.models.speech import talker

TINY = talker.CodecShape("mimi", 12.5, n_q=3, codebook_size=64)


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("talker-text")
    return synthetic.build(root / "text", synthetic.Shape.derive(64, 1, 49152),
                           tokenizer_from=default_model_dir, progress=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, text_dir):
    return talker.build(tmp_path_factory.mktemp("talker") / "bf16", text_dir=text_dir, codec=TINY)


def tensors(path):
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({n: h.get_tensor(n) for n in h.keys()})  # noqa: SIM118 (safe_open is no dict)
    return out


def test_mimi_layout():
    spec = talker.TalkerSpec.layout(talker.MIMI, 49157, {"alba": 49152}, 49156)
    # 49157 tokenizer ids padded to 49216; 8 x 2048 codes, then end-of-speech; head padded to 64
    assert (spec.codec_offset, spec.end_id, spec.head_rows, spec.vocab) == (49216, 65600, 16448, 65664)
    assert spec.token_id(7, 2047) == 65599 and spec.code_of(65599) == (7, 2047)
    assert spec.code_of(spec.end_id) is None and spec.code_of(49215) is None


def test_build_layout_config_and_tokenizer(tiny, text_dir):
    from transformers import AutoTokenizer

    cfg = json.loads((tiny / "config.json").read_text())
    spec = talker.spec_of(tiny)
    assert cfg["architectures"] == [talker.ARCHITECTURE] and cfg["tie_word_embeddings"] is False
    block = cfg[talker.CONFIG_KEY]
    assert block["codec"] == "mimi" and block["frame_rate"] == 12.5 and block["synthetic_weights"] is True
    assert (spec.n_q, spec.codebook_size, spec.text_vocab) == (3, 64, 49152 + len(talker.VOICES) + 1)
    assert spec.codec_offset == 49216 and spec.end_id == 49216 + 192 and spec.head_rows == 256
    assert cfg["vocab_size"] == spec.vocab == 49216 + 256
    t, src = tensors(tiny), tensors(text_dir)
    assert t["model.embed_tokens.weight"].shape == (spec.vocab, 64)
    assert t["lm_head.weight"].shape == (spec.head_rows, 64)
    assert torch.equal(t["model.embed_tokens.weight"][:49152], src["model.embed_tokens.weight"])
    assert torch.equal(t["model.layers.0.mlp.up_proj.weight"], src["model.layers.0.mlp.up_proj.weight"])
    head = t["lm_head.weight"].float()
    assert head[:192].std() > 0 and not head[192:].any()  # codes random; end and padding zero
    tok = AutoTokenizer.from_pretrained(str(tiny))
    assert len(tok) == spec.text_vocab
    assert {v: tok.convert_tokens_to_ids(talker.voice_token(v)) for v in talker.VOICES} == spec.voices
    assert tok.convert_tokens_to_ids(talker.SPEECH_TOKEN) == spec.speech_start_id
    assert json.loads((tiny / "generation_config.json").read_text())["eos_token_id"] == spec.end_id


def test_build_refuses_a_directory_it_did_not_make(text_dir, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(DestinationError, match="not a vllm-edge talker build"):
        talker.build(out, text_dir=text_dir, codec=TINY)
    assert (out / "notes.txt").read_text() == "keep me"


def test_rebuild_over_its_own_build_is_identical(tiny, text_dir):
    before = tensors(tiny)["lm_head.weight"]
    talker.build(tiny, text_dir=text_dir, codec=TINY)  # same seed, same kind: replaced in place
    assert torch.equal(tensors(tiny)["lm_head.weight"], before)


def test_cpu_int4_keeps_the_codec_head_bf16(tiny, tmp_path):
    from vllm_edge.quant.quantize import quantize_model

    out = quantize_model(tiny, tmp_path / "q", modules_to_not_convert=["lm_head"], progress=False)
    t = tensors(out)
    assert "model.layers.0.self_attn.q_proj.weight_packed" in t
    assert "model.embed_tokens.weight_packed" in t
    assert t["lm_head.weight"].dtype == torch.bfloat16 and "lm_head.weight_packed" not in t
    assert talker.spec_of(out) == talker.spec_of(tiny)


def test_spec_errors_name_the_field(tiny):
    cfg = json.loads((tiny / "config.json").read_text())
    block = dict(cfg[talker.CONFIG_KEY])
    with pytest.raises(talker.TalkerError, match="vllm_edge_speech is missing"):
        talker.TalkerSpec.from_config(None)
    with pytest.raises(talker.TalkerError, match=r"vllm_edge_speech\.end_id is missing"):
        talker.TalkerSpec.from_config({k: v for k, v in block.items() if k != "end_id"})
    with pytest.raises(talker.TalkerError, match=r"vllm_edge_speech\.head_rows=999"):
        talker.TalkerSpec.from_config({**block, "head_rows": 999})


def test_prompt_and_frame_bound(tiny):
    from transformers import AutoTokenizer

    spec, tok = talker.spec_of(tiny), AutoTokenizer.from_pretrained(str(tiny))
    p = talker.prompt("Hello there.", "cedar", tok, spec)["prompt_token_ids"]
    assert p[0] == spec.voices["cedar"] and p[-1] == spec.speech_start_id
    assert p[1:-1] == tok.encode("Hello there.", add_special_tokens=False)
    with pytest.raises(talker.TalkerError, match="unknown voice 'zed'"):
        talker.prompt("Hi", "zed", tok, spec)
    # 1 s lead-in plus 8 characters a second, at 12.5 frames a second
    assert talker.max_frames("x" * 80, spec) == 138 and talker.max_frames("x" * 80, spec, cap=50) == 50


def _through_vllm_sampler(logits, n):
    """What vLLM 0.32 returns per step for ``logprobs=n`` at temperature 0: its own raw
    logprobs and top-n gather, on the sampled (argmax) token."""
    from vllm.logprobs import Logprob
    from vllm.v1.sample.sampler import Sampler

    sampled = logits.argmax(-1)
    lt = Sampler.gather_logprobs(Sampler.compute_logprobs(logits), n, token_ids=sampled)
    steps = []
    for ids, lps in zip(lt.logprob_token_ids.tolist(), lt.logprobs.tolist()):
        steps.append({i: Logprob(logprob=v, rank=None) for i, v in zip(ids, lps)})
    return sampled.tolist(), steps


def _output(token_ids, logprobs):
    from vllm.outputs import CompletionOutput

    return CompletionOutput(index=0, text="", token_ids=token_ids, cumulative_logprob=None,
                            logprobs=logprobs)


def test_one_step_carries_every_codebooks_choice(tiny):
    spec = talker.spec_of(tiny)
    gen = torch.Generator().manual_seed(1)
    head = torch.randn((5, spec.head_rows), generator=gen)
    head[:, spec.n_q * spec.codebook_size] = -100.0  # end-of-speech never wins here
    want, ended = talker.choose(head, spec)
    assert not ended.any()
    ids, lps = _through_vllm_sampler(talker.step_logits(want, ended, spec), spec.n_q)
    assert ids == [spec.token_id(0, c) for c in want[:, 0].tolist()]  # codebook 0 is fed back
    fr = talker.frames(_output(ids, lps), spec)
    assert torch.equal(fr.codes, want.T) and not fr.ended and fr.steps == 5
    tail = talker.frames(_output(ids, lps), spec, start=3)  # a cumulative stream, 3 steps read
    assert torch.equal(tail.codes, want.T[:, 3:])


def test_end_of_speech_ends_the_frames(tiny):
    spec = talker.spec_of(tiny)
    head = torch.randn((3, spec.head_rows), generator=torch.Generator().manual_seed(2))
    n = spec.n_q * spec.codebook_size
    head[:, n] = -100.0
    head[2, n] = 100.0  # the third step scores end-of-speech above every code
    codes, ended = talker.choose(head, spec)
    assert ended.tolist() == [False, False, True]
    ids, lps = _through_vllm_sampler(talker.step_logits(codes, ended, spec), spec.n_q)
    assert ids[2] == spec.end_id
    fr = talker.frames(_output(ids, lps), spec)
    assert fr.ended and fr.codes.shape == (spec.n_q, 2) and torch.equal(fr.codes, codes.T[:, :2])


def test_outputs_a_talker_did_not_make_are_refused(tiny):
    spec = talker.spec_of(tiny)
    codes = torch.tensor([[5, 6, 7]])
    ids, lps = _through_vllm_sampler(talker.step_logits(codes, torch.tensor([False]), spec), spec.n_q)
    with pytest.raises(talker.TalkerError, match="no logprobs"):
        talker.frames(_output(ids, None), spec)
    with pytest.raises(talker.TalkerError, match="codes of 2 of 3 codebooks"):
        talker.frames(_output(ids, [dict(list(lps[0].items())[:2])]), spec)
    with pytest.raises(talker.TalkerError, match="not codebook 0's code"):
        talker.frames(_output([spec.token_id(1, 6)], lps), spec)  # sampled at temperature > 0
    with pytest.raises(talker.TalkerError, match="not a codec token"):
        talker.frames(_output(ids, [{**lps[0], 17: lps[0][ids[0]]}]), spec)


def test_the_plugin_registers_the_model_class():
    from vllm.model_executor.models.registry import ModelRegistry

    from vllm_edge import plugin

    plugin.register()
    assert talker.register().state == "registered"  # again: idempotent
    assert talker.ARCHITECTURE in ModelRegistry.get_supported_archs()
    assert any(r.name == talker.ARCHITECTURE and r.state == "registered" for r in plugin.registrations())
