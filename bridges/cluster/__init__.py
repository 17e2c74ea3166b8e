"""`gsim batch`: many reconstructions, closed-loop episodes and scenario renders as Ray tasks, on this machine or a
cluster."""
