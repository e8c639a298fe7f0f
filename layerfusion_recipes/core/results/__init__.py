"""Records and what is read from them: the results file, the grid's cells and their keys, LR selection on
dev, statistics of trials and the one summariser of every task's runs."""
