"""The operator's kopf handlers and settings: they gather inputs, call ``polymorph.core`` and apply
what it returns. No decision is made here.
"""
