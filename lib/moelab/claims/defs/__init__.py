"""One claim-definition file per notebook, ``nb<NN_name>.py`` (e.g. ``nb04_mass.py``), each defining
``CLAIMS: list[Claim]`` with the paper's numbers written beside each claim (issue 14; see docs/CLAIMS.md)."""
