"""The NVFP4 kernels run here under Triton's interpreter, on CPU tensors: set before triton is first imported."""

import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "files"))
