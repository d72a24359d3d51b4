"""What makes a deployed model fast or slow: its operators by class, its graph, its layout ops."""
