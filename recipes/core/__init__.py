"""What every task shares."""
