"""Pure folds of the log into the views people read: the job table, queue views,
node-pool view, cluster view; and the message catalog they render with."""
