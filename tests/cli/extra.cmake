# The CLI tests run the built program.
if(TARGET test_cli)
  add_dependencies(test_cli meshtrain)
endif()

# The hostile-input script: every case of tests/cli/hostile/cases_*.sh, with checksums of the
# files it must not touch (tests/cli/hostile.sh).
add_test(NAME cli_hostile_inputs
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/hostile.sh $<TARGET_FILE:meshtrain>)
set_tests_properties(cli_hostile_inputs PROPERTIES TIMEOUT 900 LABELS cli)
