"""gsim.editing: the Gaussian primitive library and scene edits."""
