"""The VM lab's fixtures are the end-to-end ones, switched to BlueZ (see Tests/e2e/conftest.py)."""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location("e2e_conftest", os.path.join(os.path.dirname(__file__), "..", "e2e", "conftest.py"))
_e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_e2e)
globals().update({k: v for k, v in vars(_e2e).items() if not k.startswith("__")})
