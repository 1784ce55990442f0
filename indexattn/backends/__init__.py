"""Backends of the attention core (the registry is the flex helper's; this file only makes the
package importable in the triton branch: `indexattn.backends.triton`, NAME = "triton")."""
