"""Release: end the bill at the end of the job, through the provider's API, and say what it cost.

``end`` chooses and carries out the exit action, ``providers`` speaks each provider's instance API,
``cost`` holds the price, the spend and MAX_COST, ``clock`` the deadlines from a stop to the exit; ``wrapup``
is the job's end, whatever ended it: its record, the deliverables, the final upload, then the release.
"""
