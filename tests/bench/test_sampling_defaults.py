"""The coherence judge of `bench sampling`: it passes an answer that names the word and fails
one that does not, or that loops (the garbage the chat's old defaults gave)."""

from __future__ import annotations

from vllm_edge.bench import sampling_defaults as sd


def test_the_judge_can_pass_and_fail():
    assert sd.coherent("The capital of France is Paris.", ("paris",))
    assert not sd.coherent("The capital of France is Lyon.", ("paris",))
    assert not sd.coherent("Comparison of parishes", ("paris",))  # a word, not a substring
    garbage = ("L'Allemaier des Français: 27,942 / Cité de la Tone: 4,329 (Thello toute) "
               "Cité de la Tone: 4,329 (Thello toute) Cité de la Tone: 4,329 (Thello toute)")
    assert sd.loops(garbage) and not sd.coherent(garbage + " Paris", ("paris",))
    assert sd.coherent("def add(a, b):\n    return a + b", ("def", "return"))
    assert not sd.coherent("Le Grand Paris, le Grand-Bien-Étoile, la République", ("paris",))
    assert sd.coherent("¡Hola! means hello.", ("hola",))  # punctuation is not a letter


def test_every_prompt_has_words_to_check():
    assert sd.PROMPTS[0] == sd.FRANCE and len(sd.PROMPTS) == 20
    assert all(p and words and all(w == w.lower() for w in words) for p, words in sd.PROMPTS)
