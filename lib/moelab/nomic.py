"""Former home of the nomic-embed-text-v2-moe loader; it now lives in :mod:`moelab.sba.loader` (issue 19, item 5).
Every name it exported is re-exported here unchanged, so ``from moelab.nomic import load_nomic`` keeps working."""
from moelab.sba.loader import *  # noqa: F401,F403
from moelab.sba.loader import __all__  # noqa: F401
from moelab.sba.loader import _get_moe_weights, _prefixed, _set_moe_weights  # noqa: F401  (former private helpers)
