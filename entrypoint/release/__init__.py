"""Release: the bill and its end: the price and the spend, the deadlines, the exit action through the provider's API.

``end`` chooses and carries out the exit action, ``providers`` speaks each provider's instance API,
``cost`` holds the price, the spend and MAX_COST, ``clock`` the deadlines from a stop to the exit, ``elsewhere``
whether another instance of the account still runs (a relaunch asks it about its run's lease holder). It builds on
the foundations alone, so every stage may ask it; the job's end that calls it is ``job/wrapup.py``.
"""
