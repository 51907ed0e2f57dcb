//! (module under construction in this commit series)
