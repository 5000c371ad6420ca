# The C++ API against the installed package: tests/install/example.sh builds examples/cpp with
# find_package(meshtrain) from a scratch install and runs it (dp 2 x pp 2 against one rank).
add_test(NAME cpp_example_builds_against_the_installed_package
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/install/example.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
set_tests_properties(cpp_example_builds_against_the_installed_package PROPERTIES TIMEOUT 1200 LABELS install)
