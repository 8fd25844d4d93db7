"""``python -m support.k8s_emulator``: serve the emulator as a separate process (see ``running.main``)."""

from .running import main

main()
