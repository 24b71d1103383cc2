"""Primitive-graph rewrites (Korch §3, Fig. 2b; MindSpore-style simplification): verified rules, a
fixed-point driver, and a cost-guided search for the rules that can make a plan slower."""

from kernorch.rewrite.engine import REWRITE_RULES, Firing, RewriteRule, apply_rules, rewrite_rule
from kernorch.rewrite.search import RewriteReport, Trial, rewrite

__all__ = ["REWRITE_RULES", "Firing", "RewriteReport", "RewriteRule", "Trial", "apply_rules", "rewrite",
           "rewrite_rule"]
