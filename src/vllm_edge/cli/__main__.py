"""``python -m vllm_edge.cli``: the same as the ``vllm-edge`` command."""

import sys

from vllm_edge.cli import main

if __name__ == "__main__":  # spawned children may import this module again
    sys.exit(main())
