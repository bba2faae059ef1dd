#!/usr/bin/env python
"""Print the capacity planner's figures next to the field's published GLM-5.3-Flash pools.

The same points the unit tests bound (tests/unit/test_kv_capacity.py): run it after changing the planner or a
profile's capacity figures to see how far each plan is from what the field measured.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "collections"))
sys.path.insert(0, os.path.join(ROOT, "tests", "unit"))

from test_kv_capacity import PUBLISHED, published_plan  # noqa: E402  (the points live with their bounds)


def main():
    print(f"{'setup':42} {'B/token':>9} {'planned':>11} {'published':>11} {'error':>7}")
    for name, tp, dtype, pin, max_len, mtp, block, published, _bound in PUBLISHED:
        plan = published_plan(tp, dtype, pin, max_len, mtp, block)
        error = (plan["pool_tokens"] - published) / published
        print(f"{name:42} {plan['kv_bytes_per_token']:>9,.0f} {plan['pool_tokens']:>11,} {published:>11,} "
              f"{error:>+7.1%}")


if __name__ == "__main__":
    main()
