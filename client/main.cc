// chorus: the command line for Chorus training jobs.

#include "client/cli.h"

int main(int argc, char** argv) {
  chorus::client::GlobalOptions global;
  return chorus::client::RunChorus(argc, argv, global);
}
