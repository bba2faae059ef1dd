"""python -m sparkfleet_vllm {apply,check,list} [--vllm-dir DIR]: the seams against an installed vLLM."""

import sys

from .seams import main

sys.exit(main())
