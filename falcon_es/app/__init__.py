"""The composition root and the commands built on a running controller: ``bootstrap``
builds the application once; ``service`` serves it; ``demo`` and ``simulate`` run it on
the simulated world."""
