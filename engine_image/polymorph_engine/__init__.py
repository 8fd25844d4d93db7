"""Polymorph data plane: the hot-reload inference engine, its builds, benchmark, server and agents."""
