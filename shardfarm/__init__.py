"""The bottom layer every other one may use, importing nothing of the project's: settings,
the exception tree, retry policies, logging, and the MySQL layer (``shardfarm.mysql``)."""
