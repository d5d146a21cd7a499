"""Colour lists (ALWAYS / FOLLOW / NEVER): schema, loader and built-in presets."""

from amptool.colors.loader import check_policy_source, load_policy
from amptool.colors.policy import Color, ColorPolicy, NodeRule

__all__ = ["Color", "ColorPolicy", "NodeRule", "check_policy_source", "load_policy"]
