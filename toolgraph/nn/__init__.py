"""Plain torch modules (never import Lightning): encoders, heads, GNNs, losses."""
