// membudget: predict, verify and explain the GPU memory of a transformer step.
#include "cli.hpp"

int main(int argc, char** argv) { return membudget::cli::run(argc, argv); }
