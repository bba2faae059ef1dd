"""Stand-in for the get-pip script that ansible-test downloads from its own test infrastructure (unreachable here).

ansible-test runs its cached copy (~/.ansible/test/cache/get_pip_<version>.py) inside a fresh virtual environment
with pip's options and the packages to install, e.g. ``--disable-pip-version-check pip==24.2 --no-setuptools
--no-wheel``. This installs the bundled pip with ensurepip, then the pinned pip through the machine's own pip
configuration (its index and constraints).
"""

import subprocess
import sys

# get-pip's own switches; pip install does not know them (ansible-test asks for neither setuptools nor wheel).
GET_PIP_ONLY = ("--no-setuptools", "--no-wheel")


def main() -> None:
    """Bootstrap pip, then install what ansible-test asked for."""
    args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY]
    subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args], check=True)


if __name__ == "__main__":
    main()
