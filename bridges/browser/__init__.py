"""`gsim view`: scenes, reconstructions and closed-loop runs in the browser (viser)."""
