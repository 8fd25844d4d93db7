"""Engine test support: sensitive tiny models and patched builds shared by the engine test areas."""
