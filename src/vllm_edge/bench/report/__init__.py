"""Doc generation: the pages and regions `vllm-edge report` writes from the artifacts under
benchmarks/results/ (:mod:`.results`: docs/results/results.md; :mod:`.claims`: README's
"Measured so far"; :mod:`.guide_tables`: the generated tables in the guides).

It reads what the measurements wrote and imports from them; no measurement imports it.
"""
